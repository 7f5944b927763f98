"""A scripted agent for `cargo xtask e2e`: it drives a running `gate serve` the way a real
MCP client does, with the Python MCP SDK, over stdio (`gate mcp --agent NAME`) and over
streamable HTTP with the agent's token, and plays the person with the `gate` commands.

Each transport is driven twice: with `ClientSession.initialize()` (the handshake, protocol
2025-11-25) and with the SDK's high-level `Client` in its default mode, which probes
`server/discover` and adopts protocol 2026-07-28 (its per-request envelope). In each of the
four sessions the agent also lists the resources and reads the memory server's one resource
(`memory://knowledge-graph`) through the gate, at the gate's address for it
(`gate://memory/memory://knowledge-graph`), and calls `asking__greet`, a read on the Python
SDK's own server (`asking_server.py`, reached by the gate on 2026-07-28) that asks for a name
before it answers: the agent's client answers through the gate, whichever protocol it speaks.

It prints one line per check, `ok - WHAT` or `FAIL - WHAT: WHY`, and writes the stdio
sessions (what the agent sent, what it was answered, what the person typed and was told) to
the transcript file, with the protocol version each session negotiated. Every wait is
bounded. The name of this file must not be the name of a Python module the SDK imports: the
script's folder comes first on `sys.path`.
"""

import argparse
import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import anyio
import httpx2
from mcp import Client, ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client
from mcp.client.streamable_http import streamable_http_client
from mcp.types import ElicitResult, PaginatedRequestParams

from gate_checks import Checks, staged_id


# The longest any one MCP request or person's command may take.
STEP_SECONDS = 30
# How long an auto-applied action may take to show as applied.
DRAIN_SECONDS = 15
# The protocol `ClientSession.initialize()` asks for and the gate answers.
HANDSHAKE_PROTOCOL = "2025-11-25"
# The protocol the SDK's `Client` adopts after `server/discover` (its default mode).
MODERN_PROTOCOL = "2026-07-28"
# The longest one session on that protocol may take, its connection and closing included.
MODERN_SESSION_SECONDS = 90

CHECKS = Checks('')
check = CHECKS.check


class Transcript:
    """The stdio session as a person would read it, with the scratch directory shown as
    `<root>` so the text does not depend on where the run happened."""

    def __init__(self, path, root, hidden):
        self.path = path
        self.hidden = [(str(root), "<root>"), *hidden]
        self.lines = []

    def shown(self, text):
        for path, label in self.hidden:
            text = text.replace(path, label)
        return text

    def say(self, line):
        self.lines.append(self.shown(line))

    def agent(self, tool, args):
        self.say(f"agent → {tool} {json.dumps(args, ensure_ascii=False)}")

    def answer(self, result):
        mark = "error ←" if result.is_error else "←"
        body = text_of(result).rstrip("\n").split("\n")
        self.say(f"  {mark} {body[0]}")
        for line in body[1:]:
            self.say(f"    {line}")

    def disk(self, root, name):
        """What the disk holds at `name`, as the person would see with `cat`."""
        path = root / name
        if path.is_file():
            self.say(f"disk: <root>/{name} holds {path.read_text(encoding='utf-8')!r}")
        else:
            self.say(f"disk: <root>/{name} does not exist")

    def person(self, argv, output):
        self.say("person $ " + shlex.join(["gate", *argv]))
        for line in output.rstrip("\n").split("\n"):
            self.say(f"  {line}")

    def save(self):
        self.path.write_text("\n".join(self.lines) + "\n", encoding="utf-8")


def text_of(result):
    return "\n".join(block.text for block in result.content if getattr(block, "type", "") == "text")


def action_id(answer):
    """The action id in a staged answer ("Staged as action 7: ...")."""
    found = re.search(r"action (\d+)", answer)
    return int(found.group(1)) if found else None



def agent_env():
    """What `gate mcp` needs from the environment, as an MCP client config passes it."""
    return {k: v for k, v in os.environ.items() if k in ("PATH", "HOME", "XDG_CONFIG_HOME", "XDG_DATA_HOME", "RUST_LOG")}


def snapshot(root):
    """Every file under root with its bytes, and every directory: what the disk holds."""
    seen = {}
    for path in sorted(root.rglob("*")):
        seen[str(path.relative_to(root))] = path.read_bytes() if path.is_file() else None
    return seen


class Person:
    """The person at a terminal: the `gate` command on the daemon's socket (found through
    XDG_DATA_HOME, as a person's shell would)."""

    def __init__(self, gate, transcript):
        self.gate = gate
        self.transcript = transcript

    def run(self, *argv, record=True):
        try:
            done = subprocess.run(
                [self.gate, *argv],
                capture_output=True,
                text=True,
                timeout=STEP_SECONDS,
                stdin=subprocess.DEVNULL,
            )
        except subprocess.TimeoutExpired:
            return False, f"gate {' '.join(argv)} did not answer within {STEP_SECONDS} s"
        output = done.stdout + done.stderr
        if record and self.transcript is not None:
            self.transcript.person(list(argv), output)
        return done.returncode == 0, output


class Agent:
    """One MCP client session, with bounded calls and an optional transcript."""

    def __init__(self, session, transcript=None):
        self.session = session
        self.transcript = transcript

    async def tools(self):
        with anyio.fail_after(STEP_SECONDS):
            listed = await self.session.list_tools()
        return {tool.name: tool for tool in listed.tools}

    async def call(self, tool, args):
        if self.transcript is not None:
            self.transcript.agent(tool, args)
        with anyio.fail_after(STEP_SECONDS):
            result = await self.session.call_tool(tool, args)
        if self.transcript is not None:
            self.transcript.answer(result)
        return result

    async def outcome(self, action, until, seconds=DRAIN_SECONDS):
        """Ask gate_action_result until its text contains `until` or time runs out; the
        last answer either way."""
        with anyio.move_on_after(seconds):
            while True:
                with anyio.fail_after(STEP_SECONDS):
                    result = await self.session.call_tool("gate_action_result", {"action_id": action})
                if until in text_of(result):
                    return result
                await anyio.sleep(0.2)
        return await self.call("gate_action_result", {"action_id": action})


# The memory server's one resource, and the address the gate shows it under.
MEMORY_RESOURCE = "memory://knowledge-graph"
GATE_MEMORY_RESOURCE = f"gate://memory/{MEMORY_RESOURCE}"
# How many pages of a listing the agent follows before it calls the listing endless.
MAX_PAGES = 20


async def downstream_resource(agent, what, entity=None):
    """The memory server's resource through the gate: `resources/list` shows it under the
    gate's address `gate://memory/<its uri>`, and `resources/read` of that address answers
    the server's text (the knowledge graph, as JSON) under the same address. `entity`, when
    given, is an entity the graph must hold by now."""
    session, transcript = agent.session, agent.transcript
    listing = f"{what}: resources/list shows the memory server's resource under the gate's address gate://memory/"
    resources, cursor = [], None
    try:
        with anyio.fail_after(STEP_SECONDS):
            for _ in range(MAX_PAGES):
                if isinstance(session, ClientSession):
                    listed = await session.list_resources(params=PaginatedRequestParams(cursor=cursor))
                else:
                    listed = await session.list_resources(cursor=cursor)
                resources.extend(listed.resources)
                cursor = listed.next_cursor
                if cursor is None:
                    break
    except Exception as error:  # noqa: BLE001 - the client refused the answer: a failed check, and go on
        check(listing, False, refused(error))
    else:
        uris = [str(resource.uri) for resource in resources]
        if transcript is not None:
            transcript.say(f"agent lists {len(uris)} resources: " + ", ".join(uris))
        check(listing, GATE_MEMORY_RESOURCE in uris, f"listed {uris}")

    reading = f"{what}: resources/read of {GATE_MEMORY_RESOURCE} answers the memory server's text under the gate's address"
    if transcript is not None:
        transcript.say(f"agent → resources/read {GATE_MEMORY_RESOURCE}")
    try:
        with anyio.fail_after(STEP_SECONDS):
            read = await session.read_resource(GATE_MEMORY_RESOURCE)
    except Exception as error:  # noqa: BLE001 - as above
        check(reading, False, refused(error))
        return
    contents = [(str(part.uri), getattr(part, "text", None)) for part in read.contents]
    if transcript is not None:
        for uri, text in contents:
            transcript.say(f"  ← {uri}: {text!r}")
    text = contents[0][1] if len(contents) == 1 else None
    try:
        graph = json.loads(text) if text is not None else None
    except ValueError:
        graph = None
    names = [item.get("name") for item in graph.get("entities", [])] if isinstance(graph, dict) else []
    check(reading,
          len(contents) == 1 and contents[0][0] == GATE_MEMORY_RESOURCE
          and isinstance(graph, dict) and isinstance(graph.get("entities"), list)
          and isinstance(graph.get("relations"), list)
          and (entity is None or entity in names),
          f"answered {contents}" + (f" (expected the entity {entity!r})" if entity else ""))


class Answers:
    """The agent's user, as its client's elicitation callback: it answers the asking
    server's question with `name` and counts how often it was asked."""

    def __init__(self, name):
        self.name = name
        self.asked = 0

    async def __call__(self, context, params):
        self.asked += 1
        return ElicitResult(action="accept", content={"name": self.name})


async def asking_read(agent, what, answers):
    """`asking__greet` through the gate: the Python SDK's server asks for a name (on
    2026-07-28 with an `input_required` result, which the gate hands the agent as it came
    when the agent speaks 2026-07-28 and answers by asking the agent itself otherwise), the
    agent's client answers, and the greeting carries the answer."""
    try:
        greeted = await agent.call("asking__greet", {})
    except Exception as error:  # noqa: BLE001 - a refused answer is a failed check, and go on
        check(f"{what}: a read whose server asks for input is answered by the agent's client through the gate",
              False, refused(error))
        return
    check(f"{what}: a read whose server asks for input is answered by the agent's client through the gate",
          not greeted.is_error and text_of(greeted) == f"hello, {answers.name}" and answers.asked == 1,
          f"{text_of(greeted)!r}, asked {answers.asked} times")


def refused(error):
    """Why a request raised, in a line or three (a validation error's first lines name the field)."""
    return f"{type(error).__name__}: " + " / ".join(str(error).strip().split("\n")[:3])


async def stdio_session(opts, person, transcript):
    """The agent launched `gate mcp` the way an MCP client config does; the filesystem
    server behind the gate; one approve, one reject."""
    root = opts.root
    params = StdioServerParameters(
        command=opts.gate,
        args=["mcp", "--agent", opts.agent],
        env=agent_env(),
    )
    transcript.say(f"# agent {opts.agent!r} over stdio: gate mcp --agent {opts.agent}")
    answers = Answers("stdio agent")
    async with stdio_client(params) as (read, write):
        async with ClientSession(read, write, elicitation_callback=answers) as session:
            with anyio.fail_after(STEP_SECONDS):
                await session.initialize()
            transcript.say(f"agent negotiated protocol {session.protocol_version} (by initialize)")
            agent = Agent(session, transcript)
            tools = await agent.tools()
            transcript.say(f"agent lists {len(tools)} tools: " + ", ".join(sorted(tools)))
            expected = ["files__read_text_file", "files__list_directory", "files__write_file",
                        "files__create_directory", "memory__read_graph", "memory__create_entities",
                        "gate_action_result", "gate_pending"]
            missing = [name for name in expected if name not in tools]
            check("stdio: the agent lists the servers' tools as server__tool, and the gate's own",
                  not missing, f"missing {missing} in {sorted(tools)}")
            write_tool = tools.get("files__write_file")
            read_tool = tools.get("files__read_text_file")
            check("stdio: write_file is listed without an output schema; read_text_file keeps its own",
                  write_tool is not None and write_tool.output_schema is None
                  and read_tool is not None and read_tool.output_schema is not None,
                  f"write_file {getattr(write_tool, 'output_schema', '?')}, read_text_file {getattr(read_tool, 'output_schema', '?')}")

            check(f"stdio: initialize negotiates {HANDSHAKE_PROTOCOL} through the gate",
                  session.protocol_version == HANDSHAKE_PROTOCOL, f"negotiated {session.protocol_version}")
            await downstream_resource(agent, f"stdio {session.protocol_version}")
            await asking_read(agent, f"stdio {session.protocol_version}", answers)

            listing = await agent.call("files__list_directory", {"path": str(root)})
            check("stdio: list_directory passes through to the filesystem server",
                  not listing.is_error and "hello.txt" in text_of(listing), text_of(listing))
            seeded = (root / "hello.txt").read_text(encoding="utf-8")
            read = await agent.call("files__read_text_file", {"path": str(root / "hello.txt")})
            check("stdio: read_text_file passes through and answers the file's content",
                  not read.is_error and seeded.strip() in text_of(read), text_of(read))

            # A write is held: answered at once, nothing on disk.
            target = root / "notes" / "approved.txt"
            (root / "notes").mkdir(exist_ok=True)
            content = "written by the agent, approved by a person\nline two: ünïcødé ✓\n"
            staged = await agent.call("files__write_file", {"path": str(target), "content": content})
            approved = action_id(text_of(staged))
            check("stdio: write_file is answered at once as pending, with an action id, not an error",
                  not staged.is_error and approved is not None and "Nothing has been sent" in text_of(staged),
                  text_of(staged))
            transcript.disk(root, "notes/approved.txt")
            check("stdio: the pending write_file has not touched the disk",
                  not target.exists(), f"{target} exists before approval")
            again = await agent.call("files__write_file", {"path": str(target), "content": content})
            check("stdio: the identical call again is the same action, not a second one",
                  action_id(text_of(again)) == approved and "already staged" in text_of(again), text_of(again))

            ok, pending = person.run("pending")
            check("person: gate pending lists the write", ok and f"#{approved}" in pending, pending)
            ok, shown = person.run("show", str(approved))
            check("person: gate show displays the exact arguments before the decision",
                  ok and "approved.txt" in shown and json.dumps(content, ensure_ascii=False)[1:-1] in shown, shown)
            ok, out = person.run("approve", str(approved))
            check("person: gate approve applies the write", ok, out)
            transcript.disk(root, "notes/approved.txt")
            check("disk: the approved file holds exactly the content the agent sent",
                  target.is_file() and target.read_bytes() == content.encode("utf-8"),
                  repr(target.read_bytes()) if target.exists() else "missing")
            result = await agent.call("gate_action_result", {"action_id": approved})
            check("stdio: gate_action_result says applied, with the filesystem server's answer",
                  "approved and sent" in text_of(result) and "Successfully wrote" in text_of(result),
                  text_of(result))

            # Once: the person edits the file; nothing the gate or the agent does after
            # writes it again.
            sentinel = b"edited by the person after the approval\n"
            target.write_bytes(sentinel)
            transcript.say(f"person $ echo {sentinel.decode().strip()!r} > <root>/notes/approved.txt")
            ok, out = person.run("approve", str(approved))
            check("person: approving the applied action again is refused", not ok, out)
            await agent.call("gate_action_result", {"action_id": approved})
            ok, _ = person.run("pending", record=False)
            transcript.disk(root, "notes/approved.txt")
            check("disk: the approved write happened once (the person's later edit survives)",
                  target.read_bytes() == sentinel, repr(target.read_bytes()))

            # A rejected write leaves the disk as it was, and the reason reaches the agent.
            before = snapshot(root)
            overwrite = await agent.call("files__write_file",
                                         {"path": str(root / "hello.txt"), "content": "overwritten by the agent\n"})
            rejected = action_id(text_of(overwrite))
            check("stdio: a second write_file (over hello.txt) is pending too",
                  not overwrite.is_error and rejected is not None and rejected != approved, text_of(overwrite))
            reason = "hello.txt is the greeting; leave it as it is"
            ok, out = person.run("reject", str(rejected), "--reason", reason)
            check("person: gate reject --reason rejects it", ok, out)
            transcript.disk(root, "hello.txt")
            result = await agent.call("gate_action_result", {"action_id": rejected})
            check("stdio: gate_action_result says rejected, with the person's reason",
                  "rejected" in text_of(result) and reason in text_of(result), text_of(result))
            ok, out = person.run("approve", str(rejected))
            check("person: a rejected action cannot be approved afterwards", not ok, out)
            check("disk: the rejected write left every file untouched",
                  snapshot(root) == before, "the root changed")
            return approved


async def http_session(opts, person, staged_over_stdio, transcript):
    """The same agent over streamable HTTP with its token: the memory server (byo) and the
    vetted filesystem server's auto-approvable tool under a rule."""
    root = opts.root
    with anyio.fail_after(STEP_SECONDS):
        async with httpx2.AsyncClient(timeout=STEP_SECONDS) as bare:
            refused = await bare.post(opts.url, json={"jsonrpc": "2.0", "id": 1, "method": "tools/list"},
                                      headers={"Authorization": "Bearer not-a-token-of-this-gate-000000",
                                               "Accept": "application/json, text/event-stream"})
    check("http: a request without a valid token is refused with 401", refused.status_code == 401,
          f"status {refused.status_code}")

    client = httpx2.AsyncClient(headers={"Authorization": f"Bearer {opts.token}"},
                                timeout=httpx2.Timeout(STEP_SECONDS))
    async with client:
        answers = Answers("http agent")
        async with streamable_http_client(opts.url, http_client=client) as (read, write):
            async with ClientSession(read, write, elicitation_callback=answers) as session:
                with anyio.fail_after(STEP_SECONDS):
                    await session.initialize()
                transcript.say(f"# agent {opts.agent!r} over http negotiated protocol {session.protocol_version} (by initialize)")
                agent = Agent(session)
                tools = await agent.tools()
                check("http: the agent lists the same tools with its token",
                      "files__write_file" in tools and "memory__read_graph" in tools, sorted(tools))
                result = await agent.call("gate_action_result", {"action_id": staged_over_stdio})
                check("http: the action staged over stdio is this agent's too (the bridge keeps no state)",
                      "approved and sent" in text_of(result), text_of(result))

                graph = await agent.call("memory__read_graph", {})
                check("http: memory read_graph passes through", not graph.is_error, text_of(graph))
                await asking_read(agent, f"http {session.protocol_version}", answers)
                entity = {"name": "gate-e2e", "entityType": "test", "observations": ["staged over http"]}
                staged = await agent.call("memory__create_entities", {"entities": [entity]})
                created = action_id(text_of(staged))
                memory_file = opts.memory_file
                stored = memory_file.read_text(encoding="utf-8") if memory_file.exists() else ""
                check("http: memory create_entities is pending and the memory file does not hold it",
                      created is not None and "gate-e2e" not in stored, text_of(staged) + " / " + stored)
                ok, out = person.run("approve", str(created), record=False)
                graph = await agent.call("memory__read_graph", {})
                stored = memory_file.read_text(encoding="utf-8") if memory_file.exists() else ""
                check("http: after approval the memory server holds the entity, once",
                      ok and "gate-e2e" in text_of(graph) and stored.count('"gate-e2e"') == 1,
                      out + " / " + stored)
                check(f"http: initialize negotiates {HANDSHAKE_PROTOCOL} through the gate",
                      session.protocol_version == HANDSHAKE_PROTOCOL, f"negotiated {session.protocol_version}")
                await downstream_resource(agent, f"http {session.protocol_version}", entity="gate-e2e")

                # The vetted server's non-destructive, idempotent tool, under a rule.
                first_dir = root / "made-under-review"
                staged = await agent.call("files__create_directory", {"path": str(first_dir)})
                first = action_id(text_of(staged))
                check("http: create_directory on the vetted server is pending until a rule or a person",
                      first is not None and not first_dir.exists(), text_of(staged))
                ok, out = person.run("approve", "--all-of-kind", str(first), record=False)
                check("person: gate approve --all-of-kind enables the rule and the waiting call applies",
                      ok and "rule enabled" in out and first_dir.is_dir(), out)
                second_dir = root / "made-under-the-rule"
                staged = await agent.call("files__create_directory", {"path": str(second_dir)})
                second = action_id(text_of(staged))
                result = await agent.outcome(second, "approved and sent") if second is not None else staged
                check("http: a later create_directory applies under the rule, with no one asked",
                      "approved and sent" in text_of(result) and second_dir.is_dir(), text_of(result))
                check("http: the agent is told at once that the rule applied it, with the server's answer",
                      text_of(staged).startswith(f"Applied at once as action {second}: the person's rule")
                      and "Successfully created directory" in text_of(staged), text_of(staged))
                write = await agent.call("files__write_file", {"path": str(root / "not-under-the-rule.txt"),
                                                               "content": "x"})
                ok, pending = person.run("pending", record=False)
                check("http: write_file on the vetted server still waits (the rule covers its kind only)",
                      not (root / "not-under-the-rule.txt").exists() and f"#{action_id(text_of(write))}" in pending,
                      text_of(write) + " / " + pending)
                mine = await agent.call("gate_pending", {})
                check("http: gate_pending lists the agent's open action",
                      f"action {action_id(text_of(write))}" in text_of(mine), text_of(mine))
                await scoped_grants(agent, person, root, action_id(text_of(write)))


async def scoped_grants(agent, person, root, waiting_write):
    """The person's edit of a waiting write, a rule narrowed to one path, and a grant that
    expires, on the vetted filesystem server."""
    # An edited approval: the edited arguments are what reaches the server.
    edit = root.parent / "edit.json"
    edited_path = root / "edited-by-the-person.txt"
    edit.write_text(json.dumps({"path": str(edited_path), "content": "as the person wrote it"}),
                    encoding="utf-8")
    ok, out = person.run("approve", str(waiting_write), "--arguments", str(edit))
    check("person: an edited approval sends the edited call, not the agent's",
          ok and "edited by" in out and edited_path.read_text(encoding="utf-8") == "as the person wrote it"
          and not (root / "not-under-the-rule.txt").exists(), out)
    told = await agent.call("gate_action_result", {"action_id": waiting_write})
    check("http: the agent is told its call was approved with changes, and what changed",
          "approved with changes" in text_of(told) and "edited-by-the-person.txt" in text_of(told),
          text_of(told))

    # A rule narrowed to one path: applies under it, not beside it.
    ok, out = person.run("rules", "remove", "files__create_directory", record=False)
    narrow = root / "narrow"
    ok, out = person.run("rules", "add", "files__create_directory", "--under", f"path={narrow}")
    check("person: a rule narrowed to a path is enabled and says so", ok and "is under" in out, out)
    inside = await agent.call("files__create_directory", {"path": str(narrow / "inside")})
    check("http: under the narrowed rule a directory inside the path applies at once",
          text_of(inside).startswith("Applied at once") and (narrow / "inside").is_dir(), text_of(inside))
    beside = root / "narrow-beside"
    staged = await agent.call("files__create_directory", {"path": str(beside)})
    held = action_id(text_of(staged))
    check("http: a directory beside the path waits for a person (the rule does not reach it)",
          held is not None and not beside.exists() and "A rule covers" not in text_of(staged), text_of(staged))
    ok, out = person.run("rules", "test", str(held))
    check("person: gate rules test says which part fails", ok and "no  path is under" in out, out)
    person.run("reject", str(held), record=False)

    # A grant for this agent that expires: applies at once, then no more.
    person.run("rules", "remove", "files__create_directory", record=False)
    first = root / "granted-a-while"
    staged = await agent.call("files__create_directory", {"path": str(first)})
    granted = action_id(text_of(staged))
    ok, out = person.run("approve", str(granted), "--all-of-kind", "--this-agent", "--for", "3s")
    check("person: a grant for this agent for 3 s applies the waiting call", ok and first.is_dir(), out)
    during = root / "granted-during"
    staged = await agent.call("files__create_directory", {"path": str(during)})
    check("http: within the grant's time a later call applies at once",
          text_of(staged).startswith("Applied at once") and during.is_dir(), text_of(staged))
    await anyio.sleep(3.5)
    after = root / "granted-after"
    staged = await agent.call("files__create_directory", {"path": str(after)})
    check("http: once the grant expired a call waits for a person again",
          "needs a person's approval" in text_of(staged) and not after.exists(), text_of(staged))
    ok, out = person.run("rules", record=False)
    check("person: gate rules shows the grant as expired", "(expired" in out, out)
    person.run("reject", str(action_id(text_of(staged))), record=False)


async def modern_session(opts, label, client, answers, person, transcript=None):
    """One agent on protocol 2026-07-28 through `client` (the SDK's `Client`, default mode):
    it lists the tools, reads a file, stages a write the person approves, and learns that it
    applied. `label` names the transport in the checks and the file. Answers the version the
    client negotiated, and how."""
    root = opts.root
    name = f"modern/{label}.txt"
    target = root / name
    target.parent.mkdir(exist_ok=True)
    seeded = f"seeded for the {MODERN_PROTOCOL} agent over {label}\n"
    target.write_text(seeded, encoding="utf-8")
    what = f"{label} {MODERN_PROTOCOL}"
    # The handshake happens on entering the client, so the whole session is bounded too.
    with anyio.fail_after(MODERN_SESSION_SECONDS):
        async with client:
            version = client.protocol_version
            how = "server/discover" if client.session.discover_result is not None else "initialize"
            told = f"{version} (Client, mode {client.mode!r}, by {how})"
            if transcript is not None:
                transcript.say(f"agent negotiated protocol {told}")
            if not check(f"{what}: the SDK's Client in its default mode negotiates {MODERN_PROTOCOL} through the gate",
                         version == MODERN_PROTOCOL and how == "server/discover", f"negotiated {told}"):
                return told
            agent = Agent(client, transcript)
            tools = await agent.tools()
            if transcript is not None:
                transcript.say(f"agent lists {len(tools)} tools")
            check(f"{what}: the agent lists the servers' tools and the gate's own",
                  all(tool in tools for tool in ("files__read_text_file", "files__write_file", "gate_action_result")),
                  sorted(tools))
            await downstream_resource(agent, what, entity="gate-e2e")
            await asking_read(agent, what, answers)
            read = await agent.call("files__read_text_file", {"path": str(target)})
            check(f"{what}: read_text_file passes through and answers the file's content",
                  not read.is_error and seeded.strip() in text_of(read), text_of(read))

            content = f"written by the {MODERN_PROTOCOL} agent over {label}, approved by a person\n"
            staged = await agent.call("files__write_file", {"path": str(target), "content": content})
            action = staged_id(text_of(staged))
            check(f"{what}: write_file is answered \"Staged as action N\", not an error, and the disk is untouched",
                  not staged.is_error and action is not None and target.read_text(encoding="utf-8") == seeded,
                  text_of(staged))
            if action is None:
                return told
            ok, out = person.run("approve", str(action), record=transcript is not None)
            check(f"person: gate approve applies the write staged on {MODERN_PROTOCOL} over {label}", ok, out)
            if transcript is not None:
                transcript.disk(root, name)
            result = await agent.outcome(action, "approved and sent")
            if transcript is not None:
                transcript.agent("gate_action_result", {"action_id": action})
                transcript.answer(result)
            check(f"{what}: gate_action_result says applied, with the filesystem server's answer",
                  not result.is_error and "approved and sent" in text_of(result)
                  and "Successfully wrote" in text_of(result), text_of(result))
            check(f"disk: the file holds what the agent on {MODERN_PROTOCOL} over {label} wrote",
                  target.read_bytes() == content.encode("utf-8"), repr(target.read_bytes()))
            return told


async def modern_stdio_session(opts, person, transcript):
    """`gate mcp` launched by the SDK's `Client` from a stdio command, in its default mode."""
    params = StdioServerParameters(command=opts.gate, args=["mcp", "--agent", opts.agent], env=agent_env())
    transcript.say(f"# agent {opts.agent!r} over stdio, on {MODERN_PROTOCOL}: gate mcp --agent {opts.agent}")
    answers = Answers(f"stdio agent on {MODERN_PROTOCOL}")
    return await modern_session(opts, "stdio", Client(params, elicitation_callback=answers), answers,
                                person, transcript)


async def modern_http_session(opts, person, transcript):
    """The SDK's `Client` over streamable HTTP with the agent's token, in its default mode."""
    client = httpx2.AsyncClient(headers={"Authorization": f"Bearer {opts.token}"},
                                timeout=httpx2.Timeout(STEP_SECONDS))
    async with client:
        transport = streamable_http_client(opts.url, http_client=client)
        answers = Answers(f"http agent on {MODERN_PROTOCOL}")
        told = await modern_session(opts, "http", Client(transport, elicitation_callback=answers), answers,
                                    person)
    transcript.say(f"# agent {opts.agent!r} over http, on {MODERN_PROTOCOL}, negotiated protocol {told}")


async def main(opts):
    hidden = [tuple(pair.split("=", 1)) for pair in opts.hide]
    transcript = Transcript(opts.transcript, opts.root, hidden)
    try:
        staged = await stdio_session(opts, Person(opts.gate, transcript), transcript)
        await http_session(opts, Person(opts.gate, None), staged, transcript)
        await modern_stdio_session(opts, Person(opts.gate, transcript), transcript)
        await modern_http_session(opts, Person(opts.gate, None), transcript)
    finally:
        transcript.save()



if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--gate", required=True, help="the gate binary")
    parser.add_argument("--agent", required=True, help="the agent's name in the configuration")
    parser.add_argument("--url", required=True, help="the gate's agent endpoint")
    parser.add_argument("--token", required=True, help="the agent's token")
    parser.add_argument("--root", required=True, type=Path, help="the filesystem server's root")
    parser.add_argument("--memory-file", required=True, type=Path, help="the memory server's file")
    parser.add_argument("--transcript", required=True, type=Path, help="where the stdio session is written")
    parser.add_argument("--hide", action="append", default=[], metavar="PATH=LABEL",
                        help="show PATH as LABEL in the transcript")
    options = parser.parse_args()
    CHECKS.run(main, options, 'the agent script ran to its end')
