"""error_log parsing on text captured from the 6.18 kernel."""

from probescope.engines.tracefs.errorlog import parse_error_log

CAPTURED = (
    "[  787.643888] trace_uprobe: error: Invalid register name\n"
    "  Command: p:x/y /tmp/my-prog.x:0x10 a=%rax\n"
    "                                       ^\n"
    "[  787.643953] trace_uprobe: error: Unknown type is specified\n"
    "  Command: p:x/y /tmp/my-prog.x:0x10 +0(%di):strin\n"
    "                                             ^\n"
)


def test_entries_carry_message_command_and_caret() -> None:
    first, second = parse_error_log(CAPTURED)
    assert first.location == "trace_uprobe"
    assert first.message == "Invalid register name"
    assert first.command == "p:x/y /tmp/my-prog.x:0x10 a=%rax"
    assert first.command[first.column :] == "%rax"
    assert second.message == "Unknown type is specified"
    assert second.command is not None and second.column is not None
    assert second.command[second.column :] == "strin"


def test_entry_without_command() -> None:
    (entry,) = parse_error_log("[ 1.000001] event filter parser: error: Field not found\n")
    assert entry.command is None and entry.column is None
    assert entry.location == "event filter parser"


def test_empty_log() -> None:
    assert parse_error_log("") == []
