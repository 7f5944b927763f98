"""A downstream MCP server for `cargo xtask e2e`, built on the official Python SDK: one read
tool, `greet`, that asks its client for a name before it answers. The SDK asks the way the
negotiated protocol says: on 2026-07-28 with an `input_required` result (the question and
the SDK's own request state) that the client answers by calling again, on 2025-11-25 with an
`elicitation/create` request in the middle of the call. The gate must carry both.

The name of this file must not be the name of a Python module the SDK imports: the script's
folder comes first on `sys.path`.
"""

from typing import Annotated

from mcp.server.mcpserver import Elicit, MCPServer, Resolve
from mcp.types import ToolAnnotations
from pydantic import BaseModel


class Name(BaseModel):
    """What the tool asks for."""

    name: str


def ask_name() -> Elicit[Name]:
    """The question, asked by the SDK in whichever way the protocol takes."""
    return Elicit("Whom should the greeting name?", Name)


server = MCPServer("asking")


@server.tool(annotations=ToolAnnotations(readOnlyHint=True))
def greet(name: Annotated[Name, Resolve(ask_name)]) -> str:
    """Greet whoever the client names."""
    return f"hello, {name.name}"


if __name__ == "__main__":
    server.run()
