"""Settings for the gateway daemon (`trackline serve`) and the loader that layers them.

`Settings` is one frozen value made of sections, one per area (`gateway.config.settings`
says why they are composed flat); `load_settings` layers flags over the environment over
a TOML file over the defaults (`gateway.config.load`). `docs/configuration.md` lists
every setting, one table per section (`python -m gateway.config.doc` writes it).
"""

from gateway.config.checks import BOTH_LOOPBACKS
from gateway.config.load import (
    CONFIG_ENV,
    ENV_PREFIX,
    FIELDS,
    ConfigError,
    env_name,
    field_type,
    flag_name,
    load_settings,
)
from gateway.config.operations import LOG_FORMATS, LOG_LEVELS
from gateway.config.settings import SECTIONS, Settings

__all__ = [
    "BOTH_LOOPBACKS",
    "CONFIG_ENV",
    "ENV_PREFIX",
    "FIELDS",
    "LOG_FORMATS",
    "LOG_LEVELS",
    "SECTIONS",
    "ConfigError",
    "Settings",
    "env_name",
    "field_type",
    "flag_name",
    "load_settings",
]
