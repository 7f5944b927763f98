"""A scripted agent for `cargo xtask e2e`'s simulation part: a `gate serve` of its own whose
two servers (the real npm filesystem and memory servers) have `pending = "simulate"`. Over
streamable HTTP with the Python MCP SDK, the agent writes a file, reads it back (simulated,
marked), edits it, reads it again, lists its directory (the new file shown, marked); the
person approves both writes in order with `gate approve`, and the file on disk must equal
what the agent last read. Then the same for memory entities: create them, `read_graph` shows
them marked, approve, and the real graph equals what the agent was shown.

Then seed 003's pitfalls on the same servers: a file changed on disk after the agent staged
an edit of it is flagged STALE in `gate pending` and `gate show`, `gate approve` refuses it
(nothing sent) and `gate approve --stale-seen` applies it; rejecting a write flags the edit
built on it (`gate show` says "built on #N"), and `gate reject --cascade` rejects it; for the
memory server, rejecting an entity's creation with `--cascade` rejects the observation added
to it.

It prints one line per check, `ok - WHAT` or `FAIL - WHAT: WHY`. Every wait is bounded.
"""

import argparse
import json
import re
import subprocess
import sys
from pathlib import Path

import anyio
import httpx2
from mcp import ClientSession
from mcp.client.streamable_http import streamable_http_client

from gate_checks import Checks, staged_id


STEP_SECONDS = 30
CHECKS = Checks('simulate: ')
check = CHECKS.check


def blocks(result):
    return [block.text for block in result.content if getattr(block, "type", "") == "text"]



def pending_ids(result):
    meta = result.meta or {}
    return (meta.get("gate/pending") or {}).get("actions")


def person(gate, *argv):
    done = subprocess.run([gate, *argv], capture_output=True, text=True, timeout=STEP_SECONDS,
                          stdin=subprocess.DEVNULL)
    return done.returncode == 0, done.stdout + done.stderr


async def call(session, tool, args):
    with anyio.fail_after(STEP_SECONDS):
        return await session.call_tool(tool, args)


async def files(session, opts):
    root = opts.root
    plan = str(root / "notes" / "plan.md")
    written = "step one\nstep two\n"
    staged = blocks(await call(session, "files__write_file", {"path": plan, "content": written}))
    write = staged_id(staged[0]) if staged else None
    check("write_file is staged, and the agent is told its reads will show it",
          write is not None and "your later reads of this server show this change" in staged[0], staged)

    read = await call(session, "files__read_text_file", {"path": plan})
    shown = blocks(read)
    check("the agent reads its pending file back: simulated, marked with the action id",
          len(shown) == 2 and shown[0].startswith("Simulated by the gate") and f"action {write}" in shown[0]
          and shown[1] == written and pending_ids(read) == [write], (shown, read.meta))
    check("nothing is on disk yet", not Path(plan).exists(), "notes/plan.md exists before approval")

    staged = blocks(await call(session, "files__edit_file",
                               {"path": plan, "edits": [{"oldText": "two", "newText": "2"}]}))
    edit = staged_id(staged[0]) if staged else None
    check("edit_file of the pending file is staged", edit is not None, staged)
    read = await call(session, "files__read_text_file", {"path": plan})
    shown = blocks(read)
    last = shown[1] if len(shown) == 2 else None
    check("the edit applies to the pending content, marked with both actions",
          last == "step one\nstep 2\n" and f"actions {write} and {edit}" in shown[0], shown)

    listing = await call(session, "files__list_directory", {"path": str(root / "notes")})
    shown = blocks(listing)
    entries = sorted(shown[1].splitlines()) if len(shown) == 2 else []
    check("the directory lists the new file, marked",
          entries == ["[FILE] old.md", "[FILE] plan.md"] and "plan.md is new or changed" in shown[0], shown)

    old = blocks(await call(session, "files__read_text_file", {"path": str(root / "notes" / "old.md")}))
    check("a read nothing pending touches is the server's answer alone", old == ["old\n"], old)

    ok, said = person(opts.gate, "approve", str(write), str(edit))
    check("the person approves both, in order", ok, said)
    on_disk = Path(plan).read_text(encoding="utf-8") if Path(plan).exists() else None
    check("the file on disk equals what the agent last read", on_disk == last, (on_disk, last))
    real = blocks(await call(session, "files__read_text_file", {"path": plan}))
    check("once applied, the read is the server's, unmarked", real == [last], real)


async def memory(session, opts):
    entities = [{"name": "Plan", "entityType": "doc", "observations": ["in notes"]},
                {"name": "Gate", "entityType": "tool", "observations": ["holds the send"]}]
    staged = blocks(await call(session, "memory__create_entities", {"entities": entities}))
    create = staged_id(staged[0]) if staged else None
    check("create_entities is staged", create is not None, staged)
    staged = blocks(await call(session, "memory__create_relations",
                               {"relations": [{"from": "Gate", "to": "Plan", "relationType": "guards"}]}))
    relate = staged_id(staged[0]) if staged else None
    check("create_relations is staged", relate is not None, staged)

    read = await call(session, "memory__read_graph", {})
    shown = blocks(read)
    graph = json.loads(shown[1]) if len(shown) == 2 else {}
    names = sorted(e.get("name") for e in graph.get("entities", []))
    check("read_graph shows the pending entities and relation, marked",
          shown and shown[0].startswith("Simulated by the gate")
          and f'entity "Plan" created (action {create})' in shown[0]
          and names == ["Gate", "Plan"] and len(graph.get("relations", [])) == 1, shown)
    found = blocks(await call(session, "memory__search_nodes", {"query": "notes"}))
    check("search_nodes finds a pending entity, marked",
          len(found) == 2 and found[0].startswith("Simulated by the gate") and "Plan" in found[1], found)

    ok, said = person(opts.gate, "approve", str(create), str(relate))
    check("the person approves both, in order", ok, said)
    real = blocks(await call(session, "memory__read_graph", {}))
    check("the real graph equals what the agent was shown, unmarked",
          len(real) == 1 and len(shown) == 2 and json.loads(real[0]) == graph, (real, shown))


def listed(text, action):
    """Whether `gate pending`'s answer lists action `#action` (not `#action` + more digits)."""
    return re.search(rf"#{action}\b", text) is not None


async def stage(session, tool, args):
    staged = blocks(await call(session, tool, args))
    return (staged_id(staged[0]) if staged else None), staged


async def stale(session, opts):
    path = opts.root / "notes" / "old.md"
    name = str(path)
    edit, staged = await stage(session, "files__edit_file",
                               {"path": name, "edits": [{"oldText": "old", "newText": "edited"}]})
    check("stale: edit_file of an untouched file is staged", edit is not None, staged)
    _, pending = person(opts.gate, "pending")
    check("stale: `gate pending` lists it, not stale while the file is as the agent saw it",
          listed(pending, edit) and "STALE" not in pending, pending)

    changed = "old, and a line someone else wrote\n"
    path.write_text(changed, encoding="utf-8")
    _, pending = person(opts.gate, "pending")
    check("stale: after the file changes on disk, `gate pending` flags the edit STALE",
          f"#{edit}: STALE: {name} was content sha256:" in pending, pending)
    _, shown = person(opts.gate, "show", str(edit))
    check("stale: `gate show` says STALE and how to approve it anyway",
          "STALE" in shown and f"gate approve {edit} --stale-seen" in shown, shown)
    ok, said = person(opts.gate, "approve", str(edit))
    on_disk = path.read_text(encoding="utf-8")
    check("stale: `gate approve` is refused, with advice, and nothing is sent",
          not ok and f"#{edit}: not approved: STALE" in said and "--stale-seen" in said
          and on_disk == changed, (ok, said, on_disk))
    ok, said = person(opts.gate, "approve", str(edit), "--stale-seen")
    on_disk = path.read_text(encoding="utf-8")
    check("stale: `gate approve --stale-seen` applies it to the file as it now is",
          ok and on_disk == "edited, and a line someone else wrote\n", (ok, said, on_disk))


async def built_on(session, opts):
    notes = opts.root / "notes"
    draft = str(notes / "draft.md")
    write, staged = await stage(session, "files__write_file", {"path": draft, "content": "step one\n"})
    check("built on: write_file of a new file is staged", write is not None, staged)
    edit, staged = await stage(session, "files__edit_file",
                               {"path": draft, "edits": [{"oldText": "one", "newText": "1"}]})
    check("built on: edit_file of its pending content is staged", edit is not None, staged)
    _, shown = person(opts.gate, "show", str(edit))
    check("built on: `gate show` of the edit says it is built on the write",
          f"#{edit}: built on #{write}" in shown, shown)
    _, said = person(opts.gate, "reject", str(write))
    check("built on: rejecting the write flags the edit built on it",
          "built on it, so flagged" in said and listed(said.split("so flagged", 1)[-1], edit), said)
    _, pending = person(opts.gate, "pending")
    check("built on: `gate pending` holds the flagged edit, saying its write was rejected",
          listed(pending, edit) and f"depends on #{write}, which was rejected" in pending, pending)
    ok, said = person(opts.gate, "reject", str(edit))
    _, pending = person(opts.gate, "pending")
    check("built on: the person rejects the flagged edit; nothing is on disk",
          ok and not listed(pending, edit) and not Path(draft).exists(), (said, pending))

    again = str(notes / "again.md")
    write, staged = await stage(session, "files__write_file", {"path": again, "content": "step one\n"})
    edit, staged_edit = await stage(session, "files__edit_file",
                                    {"path": again, "edits": [{"oldText": "one", "newText": "1"}]})
    check("built on: a second write and an edit of it are staged",
          write is not None and edit is not None, (staged, staged_edit))
    ok, said = person(opts.gate, "reject", str(write), "--cascade")
    _, pending = person(opts.gate, "pending")
    check("built on: `gate reject --cascade` rejects the edit built on the write too",
          ok and f"#{write}: rejecting what was built on it too (--cascade): #{edit}" in said
          and not listed(pending, write) and not listed(pending, edit) and not Path(again).exists(),
          (said, pending))


async def memory_built_on(session, opts):
    entity, staged = await stage(session, "memory__create_entities",
                                 {"entities": [{"name": "Draft", "entityType": "doc", "observations": []}]})
    check("built on: create_entities of a new entity is staged", entity is not None, staged)
    observation, staged = await stage(session, "memory__add_observations",
                                      {"observations": [{"entityName": "Draft", "contents": ["unsure"]}]})
    check("built on: add_observations to the pending entity is staged", observation is not None, staged)
    _, shown = person(opts.gate, "show", str(observation))
    check("built on: `gate show` of the observation says it is built on the entity's creation",
          f"built on #{entity}" in shown, shown)
    ok, said = person(opts.gate, "reject", str(entity), "--cascade")
    _, pending = person(opts.gate, "pending")
    check("built on: rejecting the entity's creation with --cascade rejects the observation",
          ok and f"(--cascade): #{observation}" in said and not listed(pending, observation), (said, pending))
    real = blocks(await call(session, "memory__read_graph", {}))
    names = sorted(e.get("name") for e in json.loads(real[0]).get("entities", [])) if len(real) == 1 else None
    check("built on: the real graph has neither, unmarked", names == ["Gate", "Plan"], real)


async def main(opts):
    client = httpx2.AsyncClient(headers={"Authorization": f"Bearer {opts.token}"},
                                timeout=httpx2.Timeout(STEP_SECONDS))
    async with client:
        async with streamable_http_client(opts.url, http_client=client) as (read, write):
            async with ClientSession(read, write) as session:
                with anyio.fail_after(STEP_SECONDS):
                    await session.initialize()
                await files(session, opts)
                await memory(session, opts)
                await stale(session, opts)
                await built_on(session, opts)
                await memory_built_on(session, opts)



if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--gate", required=True, help="the gate binary")
    parser.add_argument("--url", required=True, help="the gate's agent endpoint")
    parser.add_argument("--token", required=True, help="the agent's token")
    parser.add_argument("--root", required=True, type=Path, help="the filesystem server's root")
    options = parser.parse_args()
    CHECKS.run(main, options, 'the agent script ran to its end')
