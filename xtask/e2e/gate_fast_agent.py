"""A real agent framework in front of the gate, for `cargo xtask e2e`: fast-agent
(`fast-agent-mcp`, pinned), in its default mode (`protocol_mode: auto`, so its MCP SDK
probes `server/discover` and adopts protocol 2026-07-28), with the gate as its MCP server
twice: launched over stdio (`gate mcp --agent NAME`) and over streamable HTTP with the
agent's token. Its `passthrough` model stands in for the LLM: a user message
`***CALL_TOOL <name> <json>` makes the agent call that tool through its own tool loop, and
the model answers the tool's text.

Over each transport the agent lists the gate's tools, reads a file through the filesystem
server, lists the resources and reads the memory server's one resource at the gate's
address for it, calls write_file and is answered "Staged as action N" (not an error); the
person approves with `gate approve N`, and `gate_action_result` says it applied.

It prints one line per check, `ok - WHAT` or `FAIL - WHAT: WHY`. Every wait is bounded. The
name of this file must not be the name of a module fast-agent imports (`fast_agent` is
one): the script's folder comes first on `sys.path`.
"""

import argparse
import asyncio
import json
import os
import re
import subprocess
import sys
from pathlib import Path

from gate_checks import Checks, staged_id

# The longest any one agent turn or person's command may take.
STEP_SECONDS = 30
# How long an approved action may take to show as applied.
DRAIN_SECONDS = 15
# The protocol fast-agent's default mode adopts after `server/discover`.
MODERN_PROTOCOL = "2026-07-28"
# The memory server's one resource, at the address the gate shows it under.
GATE_MEMORY_RESOURCE = "gate://memory/memory://knowledge-graph"
# fast-agent's names for the gate, one per transport; its tools are `<server>__<gate's name>`.
SERVERS = ("stdio", "http")

CHECKS = Checks('')
check = CHECKS.check


def config(opts):
    """fast-agent's configuration (JSON is YAML): the gate as two MCP servers, quiet logs."""
    env = {k: v for k, v in os.environ.items() if k in ("PATH", "HOME", "XDG_CONFIG_HOME", "XDG_DATA_HOME")}
    return {
        "default_model": "passthrough",
        "logger": {"type": "none", "level": "error", "progress_display": False,
                   "show_chat": False, "show_tools": False},
        "mcp": {
            "servers": {
                "stdio": {"transport": "stdio", "command": opts.gate,
                          "args": ["mcp", "--agent", opts.agent], "env": env},
                "http": {"transport": "http", "url": opts.url,
                         "headers": {"Authorization": f"Bearer {opts.token}"}},
            },
        },
    }



def approve(opts, action):
    """The person at a terminal: `gate approve N` on the daemon's socket."""
    try:
        done = subprocess.run([opts.gate, "approve", str(action)], capture_output=True, text=True,
                              timeout=STEP_SECONDS, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        return False, f"gate approve did not answer within {STEP_SECONDS} s"
    return done.returncode == 0, done.stdout + done.stderr


def tool_results(agent, since):
    """The tool results the agent's loop recorded after history entry `since`, as
    (is_error, text) pairs."""
    found = []
    for message in agent.message_history[since:]:
        for result in (message.tool_results or {}).values():
            is_error = bool(result.is_error)
            text = "\n".join(getattr(block, "text", "") for block in result.content
                             if getattr(block, "type", "") == "text")
            found.append((is_error, text))
    return found


async def call(agent, tool, args):
    """Have the passthrough model call `tool` through the agent's loop: the one tool result
    (is_error, text), or (None, why) when the loop made no single call."""
    since = len(agent.message_history)
    reply = await asyncio.wait_for(agent.send(f"***CALL_TOOL {tool} {json.dumps(args)}"), STEP_SECONDS)
    results = tool_results(agent, since)
    if len(results) != 1:
        return None, f"{len(results)} tool results; the model answered {reply!r}"
    return results[0]


async def session(opts, agent, server):
    """One transport: the four steps, through the agent named for it."""
    root = opts.root
    what = f"fast-agent over {server}"
    statuses = await agent.aggregator.collect_server_status()
    status = statuses.get(server)
    told = f"{getattr(status, 'protocol_version', None)} (by {getattr(status, 'negotiation', None)})"
    check(f"{what}: its default mode negotiates {MODERN_PROTOCOL} through the gate",
          status is not None and status.protocol_version == MODERN_PROTOCOL, f"negotiated {told}")

    listed = await asyncio.wait_for(agent.list_tools(), STEP_SECONDS)
    names = sorted(tool.name for tool in listed.tools)
    wanted = [f"{server}__{name}" for name in ("files__read_text_file", "files__write_file", "gate_action_result")]
    check(f"{what}: the agent lists the gate's tools (as {server}__server__tool)",
          all(name in names for name in wanted), f"listed {names}")

    name = f"fast-agent/{server}.txt"
    target = root / name
    target.parent.mkdir(exist_ok=True)
    seeded = f"seeded for fast-agent over {server}\n"
    target.write_text(seeded, encoding="utf-8")
    is_error, text = await call(agent, f"{server}__files__read_text_file", {"path": str(target)})
    check(f"{what}: the passthrough model's read_text_file answers the file's content",
          is_error is False and seeded.strip() in text, f"error {is_error}: {text}")

    try:
        listed = await asyncio.wait_for(agent.list_resources(server_name=server), STEP_SECONDS)
        uris = [str(uri) for uri in listed.get(server, [])]
        check(f"{what}: resources/list shows the memory server's resource at the gate's address",
              GATE_MEMORY_RESOURCE in uris, f"listed {uris}")
        read = await asyncio.wait_for(agent.get_resource(GATE_MEMORY_RESOURCE, server_name=server),
                                      STEP_SECONDS)
        contents = [(str(c.uri), getattr(c, "text", None)) for c in read.contents]
        check(f"{what}: resources/read of {GATE_MEMORY_RESOURCE} answers the memory server's graph",
              len(contents) == 1 and contents[0][0] == GATE_MEMORY_RESOURCE and contents[0][1] is not None,
              f"read {contents}")
    except Exception as error:  # noqa: BLE001 - a failed read is a failed check, with its story
        check(f"{what}: reads the memory server's resource through the gate", False,
              f"{type(error).__name__}: {error}")

    content = f"written by fast-agent over {server}, approved by a person\n"
    is_error, text = await call(agent, f"{server}__files__write_file", {"path": str(target), "content": content})
    action = staged_id(text)
    check(f"{what}: write_file is answered \"Staged as action N\", not an error, and the disk is untouched",
          is_error is False and action is not None and target.read_text(encoding="utf-8") == seeded,
          f"error {is_error}: {text}")
    if action is None:
        return
    ok, out = approve(opts, action)
    check(f"person: gate approve applies the write fast-agent staged over {server}", ok, out)

    loop = asyncio.get_running_loop()
    deadline = loop.time() + DRAIN_SECONDS
    while True:
        is_error, text = await call(agent, f"{server}__gate_action_result", {"action_id": action})
        if "approved and sent" in text or loop.time() > deadline:
            break
        await asyncio.sleep(0.2)
    check(f"{what}: gate_action_result says applied, with the filesystem server's answer",
          is_error is False and "approved and sent" in text and "Successfully wrote" in text,
          f"error {is_error}: {text}")
    check(f"disk: the file holds what fast-agent over {server} wrote",
          target.read_bytes() == content.encode("utf-8"), repr(target.read_bytes()))


async def main(opts):
    opts.workdir.mkdir(parents=True, exist_ok=True)
    os.chdir(opts.workdir)
    config_path = opts.workdir / "fastagent.config.yaml"
    config_path.write_text(json.dumps(config(opts), indent=2), encoding="utf-8")

    from fast_agent import FastAgent

    fast = FastAgent("gate-e2e", config_path=str(config_path), parse_cli_args=False, quiet=True)
    for server in SERVERS:
        @fast.agent(name=server, instruction="Call the tools you are told to call.",
                    servers=[server], model="passthrough")
        async def _agent():
            pass

    async with fast.run() as app:
        for server in SERVERS:
            await session(opts, app[server], server)



if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--gate", required=True, help="the gate binary")
    parser.add_argument("--agent", required=True, help="the agent's name in the configuration")
    parser.add_argument("--url", required=True, help="the gate's agent endpoint")
    parser.add_argument("--token", required=True, help="the agent's token")
    parser.add_argument("--root", required=True, type=Path, help="the filesystem server's root")
    parser.add_argument("--workdir", required=True, type=Path, help="fast-agent's working directory")
    options = parser.parse_args()
    CHECKS.run(main, options, 'the fast-agent script ran to its end')
