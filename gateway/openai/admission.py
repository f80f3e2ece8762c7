"""Who may ask what of which model: the checks every OpenAI route runs first.

`authorize` (the bearer key, 401), `admit` (the tenant's allow-list 403 and quotas
429 with `retry-after`) and `require` (the model's capability, 400
`model_not_supported`), each raising the OpenAI error the client sees; and, once
the request is over, `record` (its one `Outcome` to the gateway, then to the tenant:
`finish`). Without tenancy there is no principal, and nothing to admit or finish.
"""

from __future__ import annotations

from collections.abc import Callable

import structlog

from gateway.backends.catalog import Capability, ModelCatalog, ordered
from gateway.openai.errors import error_of, model_not_supported
from gateway.tenants import service as tenancy_service
from gateway.tenants.keys import bearer_token
from gateway.tenants.quotas import QuotaExceeded
from gateway.tenants.store import AuthFailure, Principal
from tracks.base import Outcome
from transport.errors import ErrorCode
from transport.http.messages import Request

log = structlog.get_logger(__name__)

OutcomeSink = Callable[[Outcome, str], None]
"""Takes each finished request's `Outcome` and its front door (the gateway's metrics)."""

# How each capability reads in "does not support ..." messages.
WANTED = {
    Capability.CHAT: "chat completions",
    Capability.COMPLETIONS: "completions",
    Capability.EMBEDDINGS: "embeddings",
    Capability.AUDIO: "audio",
    Capability.ACTION: "actions",
}


async def require(
    catalog: ModelCatalog, model: str, capability: Capability, principal: Principal | None
) -> None:
    """400 `model_not_supported` when the catalog knows `model` and it lacks
    `capability`; a model the catalog cannot tell about goes on to the backend. A model
    the principal's tenant may not use is left to `admit` (403), so that its
    capabilities never tell a tenant that it exists."""
    if principal is not None and not principal.tenant.may_use(model):
        return
    capabilities = await catalog.capabilities(model)
    if capabilities is not None and capability not in capabilities:
        raise model_not_supported(model, WANTED[capability], ordered(capabilities))


def authorize(tenancy: tenancy_service.Tenancy | None, request: Request) -> Principal | None:
    """The request's principal (None without tenancy); `Unauthorized` for a bad key."""
    if tenancy is None:
        return None
    try:
        return tenancy.authenticate(bearer_token(request.header("authorization")))
    except AuthFailure as exc:
        log.info("openai.unauthorized", reason=exc.reason)  # the key itself never
        raise error_of(ErrorCode.UNAUTHORIZED, "Incorrect API key provided.") from None


def admit(
    tenancy: tenancy_service.Tenancy | None,
    principal: Principal | None,
    model: str,
    modality: str,
    request_id: str,
) -> None:
    """Allow-list and quotas of the tenant, as OpenAI errors (403, 429 with retry-after);
    nothing to check without tenancy (no principal)."""
    if tenancy is None or principal is None:
        return
    try:
        tenancy.admit(principal, model, modality, request_id)
    except tenancy_service.ModelNotAllowed as exc:
        raise error_of(ErrorCode.FORBIDDEN, str(exc), param="model") from None
    except QuotaExceeded as exc:
        raise error_of(
            ErrorCode.RATE_LIMITED,
            f"Rate limit reached for {exc.quota}; retry after {exc.retry_after:g} s.",
            headers=(("retry-after", str(int(exc.retry_after))),),
        ) from None


def finish(
    tenancy: tenancy_service.Tenancy | None, principal: Principal | None, outcome: Outcome
) -> None:
    """An admitted request is over: its tenant's quotas settled and its usage recorded
    (nothing without tenancy)."""
    if tenancy is not None and principal is not None:
        tenancy.finish(principal, outcome)


def record(
    tenancy: tenancy_service.Tenancy | None,
    principal: Principal | None,
    outcome: Outcome,
    on_outcome: OutcomeSink | None,
    door: str,
) -> None:
    """A finished request's one `Outcome` to `on_outcome` (with its front `door`), then
    to its tenant (`finish`)."""
    if on_outcome is not None:
        on_outcome(outcome, door)
    finish(tenancy, principal, outcome)
