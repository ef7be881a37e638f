"""A markdown file's title is its first heading that shows something once the text is cleaned
(control characters removed), as the API's rule for a title has it: a heading of control
characters only is passed over, not taken and then refused as blank, stopping the ingest."""

from __future__ import annotations

from pathlib import Path

from gateway.ingest.readers import read_paths


def test_a_heading_of_control_characters_only_is_not_the_title(tmp_path: Path) -> None:
    (tmp_path / "manual.md").write_text("# \x01\x02\n\n# Real title\n\nThe body.\n")
    (tmp_path / "notes.md").write_text("# \x1b\n\nNo other heading.\n")
    docs = {d.doc_id: d for d in read_paths([tmp_path])}
    assert docs["manual.md"].title == "Real title"
    assert docs["notes.md"].title == "notes"  # the file's stem, as with no heading
    assert "\x01" not in docs["manual.md"].text
