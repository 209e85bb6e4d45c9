"""The results page (benchmarks/BENCHMARKS.md) and the documents that cite it.

The page holds the current figure of each claim with the command that produced it;
the history lives in benchmarks/history/. These checks keep it that way: short, every
section with its command, no diary numbering in the reader-facing documents, and no
link to a history file that is not there.
"""

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "BENCHMARKS.md"
HISTORY = ROOT / "benchmarks" / "history"
MAX_LINES = 400

# "session 12", "sessions 14 and 15", "issue 7", "issues 15 and 17", "(issue".
DIARY_NUMBER = re.compile(r"\b(sessions?|issues?)\s+#?\d+|\(issues?\b", re.IGNORECASE)
# A command: an indented code line that runs something, or a fenced code block.
COMMAND_LINE = re.compile(r"^    (\.venv/bin/|make\b|disco-xla\b|for .*\.venv/bin/)")
LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)\s]*)?\)")


def sections(text):
    """The page's `## ` sections as (heading, body lines)."""
    found = []
    for line in text.splitlines():
        if line.startswith("## "):
            found.append((line, []))
        elif found:
            found[-1][1].append(line)
    return found


def names_a_command(body):
    return any(COMMAND_LINE.match(line) for line in body) or any(
        line.startswith("```") for line in body
    )


def diary_numbers(text):
    return [m.group(0) for m in DIARY_NUMBER.finditer(text)]


def history_links(text):
    """Links from the page into benchmarks/history/, as paths."""
    targets = []
    for target in LINK.findall(text):
        if target.startswith(("http://", "https://")):
            continue
        path = (RESULTS.parent / target).resolve()
        if HISTORY in path.parents or path == HISTORY:
            targets.append(path)
    return targets


def test_the_results_page_is_short():
    lines = RESULTS.read_text().splitlines()
    assert len(lines) <= MAX_LINES, f"{len(lines)} lines, at most {MAX_LINES}"


def test_every_section_names_the_command_that_produced_it():
    found = sections(RESULTS.read_text())
    assert len(found) >= 10
    missing = [heading for heading, body in found if not names_a_command(body)]
    assert missing == [], f"sections without a command: {missing}"


def test_the_replaceable_gpu_sections_are_there():
    headings = [heading for heading, _ in sections(RESULTS.read_text())]
    assert "## Published training runs (simulated against published step times)" in headings
    assert "## Headroom against the expert's XLA (simulated)" in headings


@pytest.mark.parametrize(
    "path",
    [RESULTS, ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))],
    ids=lambda p: str(p.relative_to(ROOT)),
)
def test_no_session_or_issue_numbers(path):
    assert diary_numbers(path.read_text()) == []


def test_every_linked_history_file_exists():
    text = RESULTS.read_text()
    links = history_links(text)
    assert links, "the results page links no history file"
    missing = [str(p.relative_to(ROOT)) for p in links if not p.is_file()]
    assert missing == []


def test_every_section_links_its_history():
    unlinked = [
        heading
        for heading, body in sections(RESULTS.read_text())
        if not history_links("\n".join(body))
    ]
    assert unlinked == []


def test_the_history_index_lists_every_topic():
    index = (HISTORY / "README.md").read_text()
    topics = sorted(p.name for p in HISTORY.glob("*.md") if p.name != "README.md")
    assert topics
    assert [t for t in topics if f"]({t})" not in index] == []


def test_the_checks_can_fail():
    assert diary_numbers("measured in session 12") == ["session 12"]
    assert diary_numbers("(sessions 14 and 15)") == ["sessions 14"]
    assert diary_numbers("Rank fidelity (issue 16, item 1)") != []
    assert diary_numbers("the issue's targets; a second session") == []
    assert not names_a_command(["Some prose.", "", "History: [x](history/x.md)."])
    assert names_a_command(["    .venv/bin/python benchmarks/ir_scale.py"])
    assert names_a_command(["```", "make demo", "```"])
    assert not names_a_command(["    | a table | indented |"])
    page = "## A\n\n    make demo\n\n## B\n\nprose\n"
    assert [h for h, body in sections(page) if not names_a_command(body)] == ["## B"]
    missing = (RESULTS.parent / "history/no-such-topic.md").resolve()
    assert history_links("[x](history/no-such-topic.md)") == [missing]
    assert not missing.is_file()
