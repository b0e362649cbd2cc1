"""Composition root of the console gateway: its own identity (it may only redeem sign-in
codes), the signed-in people, the API and the pages.

    settings   where the bus is, the gateway's credential, its address (settings.py)
    sessions   signed-in people and their own connections (sessions.py)
    reads      what a person may read, on those connections (reads.py)
    views      what the pages show, from the replies (views.py)
    api        the JSON API, the actions and the live stream (api.py)
"""

from __future__ import annotations

import asyncio
import contextlib
import html
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import uvicorn
from fastapi import FastAPI, Request, Response
from fastapi.responses import FileResponse, HTMLResponse, JSONResponse, RedirectResponse
from fastapi.staticfiles import StaticFiles
from gpufleet_auth import Creds
from gpufleet_client import Client, ClientError
from gpufleet_contracts.console import (
    ConsoleSession,
    ConsoleSessionEnded,
    EndConsoleSession,
    RedeemConsoleCode,
)
from pydantic import ValidationError

from .api import COOKIE, refusal_body, refusal_status, router
from .sessions import Sessions
from .settings import GatewaySettings

log = logging.getLogger("gpufleet.gateway")
EXPIRE_EVERY_S = 30.0
# Every answer: no framing (clickjacking), scripts and styles from this origin only, the
# sign-in code never sent on as a referrer.
SECURITY_HEADERS = {
    "Content-Security-Policy": (
        "default-src 'self'; img-src 'self' data:; style-src 'self'; script-src 'self'; "
        "connect-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'self'"
    ),
    "X-Frame-Options": "DENY",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
}
SIGN_IN_FAILED = """<!doctype html><meta charset="utf-8"><title>gpufleet console</title>
<link rel="stylesheet" href="/static/console.css"><main class="signin"><h1>gpufleet</h1>
<p>This sign-in link cannot be used: {why}.</p>
<p>Run <code>gpufleet console login</code> again for a new one (a link works once, for two
minutes).</p></main>"""


def web_dir(settings: GatewaySettings) -> Path:
    """The pages' files: gateway/web in the source tree, unless set."""
    return settings.console_web_dir or Path(__file__).resolve().parents[2] / "web"


def build_app(settings: GatewaySettings, sessions: Sessions) -> FastAPI:
    """The app over `sessions` (whose redeemer and connector are the bus, or a test's)."""

    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        async def expire() -> None:
            while True:
                await asyncio.sleep(EXPIRE_EVERY_S)
                await sessions.expire()

        task = asyncio.create_task(expire())
        try:
            yield
        finally:
            task.cancel()
            await sessions.close()

    app = FastAPI(title="gpufleet console", lifespan=lifespan, docs_url=None, redoc_url=None)
    app.state.sessions = sessions
    web = web_dir(settings)

    @app.middleware("http")
    async def headers(
        request: Request, call_next: Callable[[Request], Awaitable[Response]]
    ) -> Response:
        if request.method not in ("GET", "HEAD") and not same_origin(request):
            return JSONResponse({"error": {"code": "forbidden", "message": "cross-origin"}}, 403)
        response = await call_next(request)
        response.headers.update(SECURITY_HEADERS)
        if request.url.path.startswith("/api/"):
            response.headers.setdefault("Cache-Control", "no-store")
        return response

    @app.exception_handler(ClientError)
    async def refused(_: Request, exc: ClientError) -> JSONResponse:
        return JSONResponse(refusal_body(exc), status_code=refusal_status(exc.code))

    @app.get("/login", include_in_schema=False)
    async def login(code: str = "") -> Response:
        """Redeem a one-time code: a session cookie, then the console."""
        try:
            person = await sessions.sign_in(code)
        except ValidationError:
            why = "it is not a sign-in code"
            return HTMLResponse(SIGN_IN_FAILED.format(why=why), status_code=401)
        except ClientError as exc:
            known = exc.code in ("not_found", "invalid")
            why = "it is unknown, spent or expired" if known else exc.message
            return HTMLResponse(SIGN_IN_FAILED.format(why=html.escape(why)), status_code=401)
        response = RedirectResponse("/", status_code=303)
        response.set_cookie(
            COOKIE,
            person.session_id,
            max_age=max(1, int(person.expires_at - sessions.clock())),
            httponly=True,
            samesite="strict",
            secure=settings.console_secure_cookie,
            path="/",
        )
        log.info("signed in: %s", person.account or "an operator")
        return response

    @app.post("/logout", include_in_schema=False)
    async def logout(request: Request) -> Response:
        await sessions.sign_out(request.cookies.get(COOKIE) or "")
        response = JSONResponse({"signed_out": True})
        response.delete_cookie(COOKIE, path="/", httponly=True, samesite="strict")
        return response

    app.include_router(router(sessions, settings.console_refresh_s))
    vendor = web / "node_modules" / "uplot" / "dist"
    if vendor.is_dir():
        app.mount("/vendor", StaticFiles(directory=vendor), name="vendor")
    app.mount("/static", StaticFiles(directory=web / "static"), name="static")

    @app.get("/{page:path}", include_in_schema=False)
    async def index(page: str) -> FileResponse:
        """Every page is the one document; its script shows the path's view."""
        return FileResponse(web / "static" / "index.html", headers={"Cache-Control": "no-store"})

    return app


def same_origin(request: Request) -> bool:
    """A state-changing request from a page of this console (its Origin, when the browser
    sends one, is this host): with the SameSite=Strict cookie, a second bar to CSRF."""
    origin = request.headers.get("origin")
    if origin is None:
        return True
    host = request.headers.get("host", "")
    return origin.split("://", 1)[-1] == host


def bus_sessions(settings: GatewaySettings, gateway: Client) -> Sessions:
    """Sessions whose codes are redeemed, and whose credentials are revoked at sign-out, on
    the gateway's own connection, and whose people connect to the bus with their own
    credentials."""

    async def redeem(code: str) -> ConsoleSession:
        return await gateway.ask(RedeemConsoleCode.model_validate({"code": code}), ConsoleSession)

    async def connect(creds: Creds, acting_for: str | None) -> Client:
        return await Client.connect(
            creds,
            settings.servers,
            name="gpufleet-console-session",
            acting_for=acting_for,
            ca=settings.nats_ca,
            source="gpufleet/console",
        )

    async def end(creds: Creds) -> None:
        await gateway.ask(EndConsoleSession(public_key=creds.public_key), ConsoleSessionEnded)

    return Sessions(redeem, connect, end)


async def serve(settings: GatewaySettings) -> None:
    gateway = await Client.connect(
        settings.nats_creds,
        settings.servers,
        name="gpufleet-console",
        ca=settings.nats_ca,
        source="gpufleet/console",
    )
    try:
        app = build_app(settings, bus_sessions(settings, gateway))
        config = uvicorn.Config(
            app,
            host=settings.console_host,
            port=settings.console_port,
            log_level="warning",
            access_log=False,
            # the live pages' streams never end by themselves: a stop does not wait on them
            timeout_graceful_shutdown=2,
        )
        log.info("console on http://%s:%d", settings.console_host, settings.console_port)
        await uvicorn.Server(config).serve()
    finally:
        await gateway.close()


def main() -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    asyncio.run(serve(GatewaySettings()))
