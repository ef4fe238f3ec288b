"""The control token: who may change a service's state (load weights, pause the engine), and how clients say so.

One secret for the whole stack, ``CODA_CONTROL_TOKEN`` in the environment (never in a recipe, which is
committed, nor on a command line, which ``ps`` shows); ``make up`` writes a random one into ``.env`` and
compose gives it to every service. A control route (``dependencies=shared.http.CONTROL``) answers only a
request carrying ``Authorization: Bearer <token>`` (vLLM's ``--api-key`` convention), compared in constant
time. Without a token configured (a local ``make train``, everything on 127.0.0.1) a control route answers
loopback clients only, so a checkout works with no setup and a server bound to a public interface by mistake
still takes no orders from the network. A reverse proxy on the same host makes every request look local:
behind one, set the token.

The clients (``shared.inference_client``: ``InferenceClient``, its sync wrapper, ``AiohttpCompletions``) send
the configured token with every request, so a vLLM started with ``VLLM_API_KEY`` set to it (which guards all
of ``/v1``) serves them too. No FastAPI here: the clients import this module, the server side is ``shared.http.require_control_token``.
"""

from __future__ import annotations

import hmac
import ipaddress
import os

CONTROL_TOKEN_ENV = "CODA_CONTROL_TOKEN"


def control_token() -> str | None:
    """The configured token (surrounding whitespace ignored), or None when unset or empty. Read at each call:
    a test or an operator changing the environment is seen without a rebuild."""
    return os.environ.get(CONTROL_TOKEN_ENV, "").strip() or None


def bearer_headers(token: str | None = None) -> dict[str, str]:
    """``Authorization: Bearer`` for ``token``, else for the configured one; empty when there is none."""
    token = token or control_token()
    return {"Authorization": f"Bearer {token}"} if token else {}


def is_loopback(host: str | None) -> bool:
    """True for 127.0.0.0/8 and ::1 (IPv4-mapped too). Anything else, a name included, is not."""
    if not host:
        return False
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return False
    mapped = getattr(address, "ipv4_mapped", None)
    return (mapped or address).is_loopback


def refusal(client_host: str | None, authorization: str) -> str | None:
    """Why a control request from ``client_host`` with this ``Authorization`` header is refused, or None."""
    token = control_token()
    if token is None:
        if is_loopback(client_host):
            return None
        return (
            f"control routes answer only local clients while no control token is configured (this request came "
            f"from {client_host or 'an unknown address'}): set {CONTROL_TOKEN_ENV} on the server and send "
            "'Authorization: Bearer <token>'"
        )
    scheme, _, given = authorization.partition(" ")
    if scheme.lower() != "bearer" or not given.strip():
        return f"this route needs 'Authorization: Bearer <token>' (the server's {CONTROL_TOKEN_ENV})"
    if not hmac.compare_digest(given.strip().encode(), token.encode()):
        return "invalid control token"
    return None
