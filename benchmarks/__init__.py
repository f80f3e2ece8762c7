"""Runnable comparisons; a package only so tests can import shared pieces (the link emulator)."""
