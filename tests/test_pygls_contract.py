"""lsp/protocol.py's HardenedProtocol overrides and reads pygls private members and steps
through its `lsp_initialize` generator by hand. pyproject pins the pygls minor this was written
against; these tests fail loudly, naming the member, when a pygls release changes one of them."""

import inspect
import re
from importlib.metadata import version
from pathlib import Path

from pygls.protocol import JsonRPCProtocol, LanguageServerProtocol

from codespec_lsp.lsp.server import build_server

PYPROJECT = Path(__file__).resolve().parents[1] / "pyproject.toml"


def _params(fn) -> list[str]:
    return list(inspect.signature(fn).parameters)


def test_the_installed_pygls_is_the_pinned_minor():
    pin = re.search(r'"pygls>=(\d+)\.(\d+),<(\d+)\.(\d+)"', PYPROJECT.read_text())
    assert pin, "pyproject.toml must pin pygls to one minor: pygls>=X.Y,<X.Y+1"
    lo, hi = (int(pin[1]), int(pin[2])), (int(pin[3]), int(pin[4]))
    assert hi == (lo[0], lo[1] + 1), f"the pin spans more than one minor: {pin[0]}"
    installed = tuple(int(x) for x in version("pygls").split(".")[:2])
    assert installed == lo, f"pygls {version('pygls')} installed, {pin[0]} pinned"


def test_the_overridden_methods_keep_their_signatures():
    assert _params(JsonRPCProtocol._execute_handler) == [
        "self", "msg_id", "handler", "callback", "args", "kwargs"]
    assert _params(JsonRPCProtocol._handle_cancel_notification) == ["self", "msg_id"]
    assert _params(JsonRPCProtocol._handle_request) == ["self", "msg_id", "method_name", "params"]
    assert _params(JsonRPCProtocol._send_data) == ["self", "data"]
    assert _params(JsonRPCProtocol.structure_message) == ["self", "data"]
    assert _params(JsonRPCProtocol.handle_message) == ["self", "message"]


def test_lsp_initialize_is_a_generator_that_builds_the_workspace_before_yielding():
    # HardenedProtocol swaps its Workspace in after the first step: pygls must have built one
    # by then (and only then hand over to the user's initialize handler).
    assert inspect.isgeneratorfunction(LanguageServerProtocol.lsp_initialize)
    source = inspect.getsource(LanguageServerProtocol.lsp_initialize)
    assert source.index("self._workspace = Workspace(") < source.index("yield user_handler")
    for name in ("lsp_shutdown", "lsp_exit"):
        assert inspect.isgeneratorfunction(getattr(LanguageServerProtocol, name)), name


def test_the_private_state_read_and_written_is_there():
    protocol = build_server().protocol
    assert isinstance(protocol._request_futures, dict)
    assert protocol._shutdown is False
    assert protocol._workspace is None  # until initialize; the `workspace` property reads it
    assert "self._workspace" in inspect.getsource(type(protocol).workspace.fget)
    assert callable(protocol._server._report_server_error)
    assert isinstance(protocol.fm.features, dict)
