"""Image paths in pasted text (how terminals deliver dropped files)."""

from __future__ import annotations

from app.tui.paths_in_text import find_image_paths, remove_spans, split_words


def nothing_exists(path: str) -> bool:
    return False


def find(text: str, exists=nothing_exists):
    return find_image_paths(text, exists=exists)


def test_plain_absolute_path_is_taken_out_of_the_text():
    found = find("describe /home/me/cat.png please")
    assert found.paths == ["/home/me/cat.png"]
    assert found.text == "describe please"


def test_single_and_double_quoted_paths_with_spaces():
    found = find("'/Users/me/my cat.JPG' \"/tmp/a b/c.webp\"")
    assert found.paths == ["/Users/me/my cat.JPG", "/tmp/a b/c.webp"]
    assert found.text == ""


def test_backslash_escaped_spaces_and_parentheses():
    found = find(r"/Users/me/Screen\ Shot\ \(1\).png")
    assert found.paths == ["/Users/me/Screen Shot (1).png"]
    assert found.text == ""


def test_file_urls_are_decoded_and_foreign_hosts_ignored():
    found = find("file:///home/me/my%20cat.png file://otherhost/x.png")
    assert found.paths == ["/home/me/my cat.png"]
    assert found.text == "file://otherhost/x.png"


def test_several_paths_on_separate_lines_and_duplicates_once():
    found = find("/a/one.png\n/a/two.gif\n/a/one.png\n")
    assert found.paths == ["/a/one.png", "/a/two.gif"]
    assert found.text == ""


def test_text_around_paths_keeps_its_lines():
    found = find("first line\nlook at /x/y.png\nlast line")
    assert found.paths == ["/x/y.png"]
    assert found.text == "first line\nlook at\nlast line"


def test_bare_names_count_only_when_the_file_exists():
    assert find("compare a.png and b.png").paths == []
    found = find("compare a.png and b.png", exists=lambda p: p == "a.png")
    assert found.paths == ["a.png"]
    assert found.text == "compare and b.png"


def test_non_image_paths_and_prose_stay():
    text = "see /etc/hosts and don't touch it's fine"
    found = find(text)
    assert found.paths == []
    assert found.text == text


def test_tilde_expands(monkeypatch):
    monkeypatch.setenv("HOME", "/home/someone")
    assert find("~/pics/a.jpeg").paths == ["/home/someone/pics/a.jpeg"]


def test_unclosed_quote_is_a_literal_character():
    words = split_words("'/tmp/a.png")
    assert [w.value for w in words] == ["'/tmp/a.png"]
    assert find("'/tmp/a.png").paths == []


def test_windows_path_backslashes_survive():
    assert find(r"C:\Users\me\cat.png").paths == [r"C:\Users\me\cat.png"]


def test_remove_spans_eats_the_separating_space_once():
    assert remove_spans("a XX b", [(2, 4)]) == "a b"
    assert remove_spans("a XX", [(2, 4)]) == "a"
    assert remove_spans("XX", [(0, 2)]) == ""
    assert remove_spans("abc", []) == "abc"
