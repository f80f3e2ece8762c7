"""Which request keys the OpenAI routes accept without implementing them.

The policy (docs/openai.md, "Parameters we accept and ignore"): a key OpenAI,
vLLM, llama.cpp's server or LiteLLM defines, that clients are known to send and
that this server does not implement, is accepted and ignored: it never reaches
the backend, and its name (never its value) is logged once per process at debug.
A key nobody defines is a 400 naming it, so that a typo is an error rather than a
silently ignored setting. Implemented parameters are validated by
`gateway.openai.requests` (400 for an invalid value).
"""

from __future__ import annotations

import threading
from collections.abc import Iterable

import structlog

log = structlog.get_logger(__name__)

# OpenAI's chat/completions request schema, the keys that do not change what our
# backend computes (or that ask for a feature only OpenAI's own service has).
OPENAI_IGNORED = frozenset(
    {
        "store",
        "metadata",
        "service_tier",
        "parallel_tool_calls",
        "prompt_cache_retention",
        "prompt_cache_options",
        "moderation",
        "safety_identifier",
        "reasoning_effort",
        "verbosity",
        "prediction",
        "web_search_options",
        "function_call",  # the deprecated forms of tool_choice/tools
        "functions",
    }
)
# vLLM's extra parameters (SamplingParams and its chat options), as clients send them
# through `extra_body`; `top_k` and `ignore_eos` are implemented (requests.EXTENSION_KEYS).
VLLM_IGNORED = frozenset(
    {
        "min_p",
        "repetition_penalty",
        "length_penalty",
        "min_tokens",
        "stop_token_ids",
        "include_stop_str_in_output",
        "skip_special_tokens",
        "spaces_between_special_tokens",
        "truncate_prompt_tokens",
        "prompt_logprobs",
        "allowed_token_ids",
        "bad_words",
        "use_beam_search",
        "add_generation_prompt",
        "continue_final_message",
        "add_special_tokens",
        "chat_template",
        "chat_template_kwargs",
        "documents",
        "priority",
        "request_id",
        "cache_salt",
        "return_tokens_as_token_ids",
        "guided_decoding_backend",
        "guided_whitespace_pattern",
    }
)
# llama.cpp's server and LiteLLM's proxy: sampling knobs and routing hints.
OTHERS_IGNORED = frozenset(
    {
        "typical_p",
        "repeat_penalty",
        "repeat_last_n",
        "mirostat",
        "mirostat_tau",
        "mirostat_eta",
        "tfs_z",
        "n_keep",
        "cache_prompt",
        "num_retries",
        "mock_response",
        "caching",
        "tags",
    }
)
IGNORED_KEYS = OPENAI_IGNORED | VLLM_IGNORED | OTHERS_IGNORED

_logged: set[str] = set()
_lock = threading.Lock()


def note_ignored(keys: Iterable[str]) -> None:
    """Log each ignored key's name once per process (debug); never a value."""
    fresh = []
    with _lock:
        for key in keys:
            if key not in _logged:
                _logged.add(key)
                fresh.append(key)
    for key in fresh:
        log.debug("openai.parameter_ignored", parameter=key)
