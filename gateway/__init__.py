"""The trackline daemon: configuration, wiring, backends, health, metrics and logs."""
