"""The page's pure logic, run in the browser that runs the page (its ES modules, imported
as the page imports them): how copies of a story meet (web/merge.js), undo as diffs
(web/history.js), nodes renumbered (web/tree.js), tree labels (web/treeview.js) and the
cut of a story too long for the context (web/budget.js). Each case states a rule of
docs/library.md."""

from __future__ import annotations

from typing import Any

import pytest

from tests.integration.bundled import GEMMA
from tests.integration.ui_helpers import expect
from tests.support.server import RunningServer

pytestmark = pytest.mark.models(GEMMA)

# A story of three nodes: the start (with two cards), a card used, the writer's edit.
SETUP = """
const Tree = await import("./tree.js");
const Merge = await import("./merge.js");
const History = await import("./history.js");
const card = (text) => ({ text, finish_reason: "stop", tokens: 2, edited: false });
const node = (id, parent, text, extra = {}) => ({
  id, parent, via: null, via_node: null, text, model_chars: 0, retry_of: null, bookmarked: false,
  choices: [], params: null, context: null, stats: null, created: null, ...extra,
});
const story = () => {
  const t = Tree.createTree({ name: "The Letter", settings: { n: "2" } });
  t.nodes.set(1, node(1, null, "Once.", { choices: [card(" Come."), card(" Go.")] }));
  t.nodes.set(2, node(2, 1, "Once. Come.", { via: 0, model_chars: 6 }));
  t.nodes.set(3, node(3, 1, "Once, then."));
  t.nextId = 4;
  t.current = 2;
  return t;
};
// The server's changes after `base` when it holds `theirs`.
const changesOf = (base, theirs, revision = 2) => ({
  since: 1, revision, next_id: Tree.freeId(theirs),
  nodes: [...theirs.nodes.values()].filter((n) => !base.nodes.has(n.id) || !Tree.sameNode(n, base.nodes.get(n.id))),
  deleted: [...base.nodes.keys()].filter((id) => !theirs.nodes.has(id)),
  fields: { memory: theirs.context.memory, note: theirs.context.note, settings: theirs.settings, name: theirs.name },
});
const ids = (t) => [...t.nodes.keys()].sort((a, b) => a - b);
"""


def run(page: Any, body: str) -> Any:
    return page.evaluate(f"async () => {{ {SETUP}\n{body} }}")


@pytest.fixture(scope="module")
def page(browser: Any, server: RunningServer) -> Any:
    context = browser.new_context()
    opened = context.new_page()
    opened.goto(server.base_url + "/")
    expect(opened.get_by_test_id("library")).to_be_visible()
    yield opened
    context.close()


def test_a_diff_applied_to_the_base_gives_the_writers_copy(page: Any) -> None:
    assert run(
        page,
        """
        const base = story();
        const mine = Tree.clone(base);
        mine.nodes.get(1).bookmarked = true;
        mine.nodes.delete(3);
        mine.nodes.set(4, node(4, 2, "Once. Come. Home."));
        mine.context = { ...mine.context, note: "[gothic]" };
        const patch = Merge.diff(base, mine);
        const sent = Merge.applyPatch(Tree.clone(base), patch);
        return [patch.nodes.map((n) => Object.keys(n).join()), patch.deleted, patch.context,
                ids(sent), Tree.sameNode(sent.nodes.get(1), mine.nodes.get(1)),
                Merge.isEmpty(Merge.diff(sent, mine))];
    """,
    ) == [
        [
            "id,bookmarked",
            ",".join(
                [
                    "id",
                    "parent",
                    "via",
                    "via_node",
                    "text",
                    "model_chars",
                    "retry_of",
                    "bookmarked",
                    "choices",
                    "params",
                    "context",
                    "stats",
                    "created",
                ]
            ),
        ],
        [3],
        {"note": "[gothic]"},
        [1, 2, 4],
        True,
        True,
    ]


def test_only_one_side_changed_is_taken_and_the_same_value_is_no_clash(page: Any) -> None:
    assert run(
        page,
        """
        const base = story();
        const mine = Tree.clone(base);
        const theirs = Tree.clone(base);
        mine.nodes.get(1).bookmarked = true;            // only mine
        theirs.nodes.get(2).choices = [card(" Home.")]; // only theirs
        mine.nodes.get(3).text = "Once, then again.";   // both, the same
        theirs.nodes.get(3).text = "Once, then again.";
        theirs.context.memory = "Maine.";
        const { conflicts, changed } = Merge.rebase(base, mine, changesOf(base, theirs));
        return [conflicts, changed, mine.nodes.get(1).bookmarked, mine.nodes.get(2).choices[0].text,
                mine.context.memory, mine.nodes.get(2).choices === theirs.nodes.get(2).choices];
    """,
    ) == [[], True, True, " Home.", "Maine.", False]


def test_both_changing_one_field_is_a_clash_and_keep_both_keeps_a_copy(page: Any) -> None:
    result = run(
        page,
        """
        const base = story();
        const mine = Tree.clone(base);
        const theirs = Tree.clone(base);
        mine.nodes.get(1).choices = [card(" Mine."), card(" Go.")];
        theirs.nodes.get(1).choices = [card(" Theirs."), card(" Go.")];
        mine.context.memory = "Mine.";
        theirs.context.memory = "Theirs.";
        const { theirs: server, conflicts } = Merge.rebase(base, mine, changesOf(base, theirs));
        const kinds = conflicts.map((c) => [c.kind, c.node ?? c.field, c.field ?? null]);
        const words = conflicts.map(Merge.describe);
        Merge.resolve(mine, base, server, conflicts, "both");
        const copy = mine.nodes.get(4);
        return [kinds, words, mine.nodes.get(1).choices[0].text, copy.choices[0].text, copy.parent,
                mine.context.memory];
    """,
    )
    assert result == [
        [["field", 1, "choices"], ["meta", "memory", "memory"]],
        ["#1: its continuations", "the memory"],
        " Theirs.",
        " Mine.",
        None,
        "Mine.",  # for the story's own fields, "both" keeps the writer's
    ]


def test_deleting_on_one_side_and_changing_on_the_other_clash_both_ways(page: Any) -> None:
    result = run(
        page,
        """
        const out = [];
        for (const answer of ["mine", "theirs", "both"]) {
          const base = story();
          const mine = Tree.clone(base);
          const theirs = Tree.clone(base);
          Tree.deleteSubtree(mine, 2);                       // deleted here, changed there
          theirs.nodes.get(2).bookmarked = true;
          mine.nodes.set(4, node(4, 3, "Once, then. More."));  // added here under a node
          Tree.deleteSubtree(theirs, 3);                     // deleted there
          const { theirs: server, conflicts } = Merge.rebase(base, mine, changesOf(base, theirs));
          Merge.resolve(mine, base, server, conflicts, answer);
          out.push([answer, conflicts.map((c) => `${c.kind} #${c.node}`), ids(mine)]);
        }
        return out;
    """,
    )
    assert result == [
        ["mine", ["deleted-here #2", "deleted-there #3"], [1, 3, 4]],
        ["theirs", ["deleted-here #2", "deleted-there #3"], [1, 2]],
        ["both", ["deleted-here #2", "deleted-there #3"], [1, 2, 3, 4]],
    ]


def test_the_whole_story_from_the_server_deletes_what_it_no_longer_has(page: Any) -> None:
    """A copy older than the deletions the server still remembers (its tombstones were
    compacted) gets the whole story (`whole`): a node it lacks was deleted there."""
    result = run(
        page,
        """
        const base = story();
        const mine = Tree.clone(base);
        mine.nodes.get(2).bookmarked = true;                  // changed here, deleted there
        mine.nodes.set(4, node(4, 1, "Once. Mine."));         // the writer's own new node
        const theirs = Tree.clone(base);
        Tree.deleteSubtree(theirs, 2);
        Tree.deleteSubtree(theirs, 3);
        const whole = { ...changesOf(base, theirs), since: 0, deleted: [], whole: true,
                        nodes: [...theirs.nodes.values()] };
        const { theirs: server, conflicts } = Merge.rebase(base, mine, whole);
        return [ids(server), conflicts.map((c) => `${c.kind} #${c.node}`), ids(mine),
                ids(Merge.applyChanges(story(), whole))];
    """,
    )
    assert result == [[1], ["deleted-there #2"], [1, 2, 4], [1]]


def test_their_new_node_on_an_id_mine_holds_pushes_mine_aside(page: Any) -> None:
    assert run(
        page,
        """
        const base = story();
        const mine = Tree.clone(base);
        const theirs = Tree.clone(base);
        mine.nodes.set(4, node(4, 2, "Once. Come. Mine."));
        mine.nodes.set(5, node(5, 4, "Once. Come. Mine. More.", { retry_of: 4 }));
        mine.current = 5;
        theirs.nodes.set(4, node(4, 2, "Once. Come. Theirs."));
        const same = Tree.clone(theirs);  // and one identical to theirs: the same node
        const { conflicts, moves } = Merge.rebase(base, mine, changesOf(base, theirs));
        const { moves: none } = Merge.rebase(base, same, changesOf(base, theirs));
        const texts = ids(mine).map((id) => mine.nodes.get(id).text);
        const child = mine.nodes.get(5);  // it follows its parent's new id
        return [conflicts, [...moves], texts, child.parent, child.retry_of, mine.current, none.size];
    """,
    ) == [
        [],
        [[4, 6]],
        [
            "Once.",
            "Once. Come.",
            "Once, then.",
            "Once. Come. Theirs.",
            "Once. Come. Mine. More.",
            "Once. Come. Mine.",
        ],
        6,
        6,
        5,
        0,
    ]


def test_undo_takes_back_the_writers_change_only_and_never_orphans(page: Any) -> None:
    assert run(
        page,
        """
        const tree = story();
        const history = History.createHistory();
        History.record(history, tree);
        tree.nodes.set(4, node(4, 2, "Once. Come. Home."));  // the writer's change
        History.commit(history, tree);
        tree.nodes.set(5, node(5, 4, "Once. Come. Home. Theirs."));  // merged from another tab
        tree.nodes.set(6, node(6, 1, "Once. Elsewhere."));
        History.undo(history, tree);
        const afterUndo = ids(tree);
        History.renumber(history, new Map([[4, 9]]));
        Tree.renumber(tree, new Map([[4, 9]]));
        History.redo(history, tree);
        History.undo(history, tree);
        return [afterUndo, ids(tree), history.future.length, History.fingerprint(history).split("/")[0].split(":")[0]];
    """,
    ) == [[1, 2, 3, 4, 5, 6], [1, 2, 3, 5, 6, 9], 1, "0"]


def test_renumbering_moves_a_node_that_sits_on_a_new_id(page: Any) -> None:
    assert run(
        page,
        """
        const tree = story();
        tree.nodes.set(4, node(4, 2, "Once. Come. Mine."));
        tree.nodes.set(5, node(5, 4, "Once. Come. Mine. On."));
        tree.current = 5;
        const all = Tree.renumber(tree, new Map([[4, 5]]));  // the server gave 4 the id 5
        return [[...all], ids(tree), tree.nodes.get(6).parent, tree.current, tree.nextId];
    """,
    ) == [[[4, 5], [5, 6]], [1, 2, 3, 5, 6], 5, 6, 7]


def test_labels_say_what_changed_and_where_siblings_differ(page: Any) -> None:
    assert run(
        page,
        """
        const TreeView = await import("./treeview.js");
        const t = story();
        t.nodes.set(4, node(4, 1, "Once. The long road north, and then the sea.", { via: 1 }));
        t.nodes.set(5, node(5, 1, "Once. The long road north, and then the hills.", { via: 0 }));
        t.nodes.set(6, node(6, 1, "Once.", { retry_of: 1, choices: [card(" Again and again.")] }));
        t.nodes.set(7, node(7, 2, "Once."));
        const kids = Tree.childrenOf(t, 1);
        return [2, 3, 4, 6, 7].map((id) => TreeView.label(t, t.nodes.get(id), kids));
    """,
    ) == [
        "Come.",
        ", then",  # inserted before the final full stop
        "…north, and then the sea.",
        "again: Again and again.",
        "cut “Come.”",
    ]


def test_a_story_too_long_for_the_context_loses_its_start_in_steps(page: Any) -> None:
    """The cut lands on a paragraph, and the story growing a little keeps the same cut
    (the prefix cache keeps serving it)."""
    result = page.evaluate("""async () => {
        const Budget = await import("./budget.js");
        const { buildPrompt } = await import("./prompt.js");
        const story = Array.from({ length: 40 }, (_, i) => `Paragraph ${i}: the tide came in.`).join("\\n");
        const context = { memory: "Maine.", note: "", depth: 3 };
        const cutOf = (text) => {
          const prompt = buildPrompt(text, context);
          Budget.remember(prompt, Math.round(prompt.length / 4), 256);  // 4 characters a token
          return Budget.fit(text, context, 64);
        };
        const a = cutOf(story);
        const b = cutOf(story + " The end came.");
        const short = cutOf(story.slice(0, 300));
        return [a.cutChars > 0, story[a.cutChars - 1], a.cutChars === b.cutChars,
                a.tokens + 64 <= 256, short.cutChars, Budget.words("one  two\\nthree")];
    }""")
    assert result == [True, "\n", True, True, 0, 3]
