"""Every YAML mtplab reads goes through one loader (mtplab/yamlfile.py): bad YAML, a python
tag, a binary, a duplicate key, aliases that contain themselves or expand beyond the bound,
and an empty document each get one sentence: ConfigError in Python, exit 2 on the command
line, wherever the YAML comes from (grid file, bench group, schedule file, inline schedule,
--set)."""
from __future__ import annotations

import pytest

from mtplab import cli
from mtplab.errors import ConfigError
from mtplab.yamlfile import MAX_NODES, load_yaml, read_yaml

# nine levels of nine aliases: 9**9 (387 million) strings in about 500 bytes
LAUGHS = "a0: &a0 [lol, lol, lol, lol, lol, lol, lol, lol, lol]\n" + "".join(
    f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 9)}]\n" for i in range(1, 9)) + "base: *a8\n"

# (file bytes, the words of the one sentence)
BAD = [
    (b"{4: [3, 1", "expected ',' or ']'"),
    (b"base: !!python/object/apply:os.system ['echo hi']\n",
     "the tag !!python/object/apply:os.system is not allowed"),
    (b"base: !custom 3\n", "the tag !custom is not allowed"),
    (bytes(range(256)) * 4, "is not a text file (byte 0x80 at offset 128 is not UTF-8)"),
    (b"base:\0 {}\n", "holds NUL bytes, so it is a binary"),
    (b"base: {page_size: 1, page_size: 2}\n", "key 'page_size' is given twice"),
    (b"4: [3, 1]\n4: [2, 1]\n", "key 4 is given twice"),
    (b"a: &x [1, *x]\n", "refers to a node that contains it"),
    (LAUGHS.encode(), f"its aliases expand to more than {MAX_NODES:,} values"),
    (b"", "is empty (no YAML document)"),
    (b"# only a comment\n", "is empty (no YAML document)"),
    (b"[" * 5000, "nest"),
]
IDS = [m[:28] for _, m in BAD]


@pytest.mark.parametrize("data,message", BAD, ids=IDS)
def test_the_loader_refuses_in_one_sentence(tmp_path, data, message):
    f = tmp_path / "doc.yaml"
    f.write_bytes(data)
    with pytest.raises(ConfigError) as e:
        read_yaml(f, f"grid file {f}")
    text = str(e.value)
    assert message in text and "\n" not in text and str(f) in text, text


def test_an_empty_value_is_allowed_where_asked():
    assert load_yaml("", "--set x=", empty_ok=True) is None
    assert load_yaml("{a: [1, 2]}", "x") == {"a": [1, 2]}


def test_aliases_within_the_bound_load():
    doc = load_yaml("a: &a [1, 2, 3]\nb: [*a, *a]\n", "x")
    assert doc["b"] == [[1, 2, 3], [1, 2, 3]]


def _main(argv):
    try:
        return cli.main(argv)
    except SystemExit as e:
        return int(e.code or 0)


# every way in: {f} is the file holding the bad bytes
ENTRIES = [
    ["sweep", "{f}", "--dry-run"],
    ["bench", "--groups", "{f}", "--dir", "{tmp}/b"],
    ["run", "--device", "cpu", "--draft", "eagle", "--spec-schedule", "{f}"],
]


@pytest.mark.parametrize("argv", ENTRIES, ids=lambda a: a[0])
@pytest.mark.parametrize("data,message", [BAD[1], BAD[3], BAD[6], BAD[8], BAD[9]],
                         ids=[IDS[1], IDS[3], IDS[6], IDS[8], IDS[9]])
def test_every_command_reading_yaml_exits_2_in_one_line(tmp_path, capsys, argv, data,
                                                        message):
    f = tmp_path / "bad.yaml"
    f.write_bytes(data)
    before = sorted(p.name for p in tmp_path.iterdir())
    assert _main([a.format(f=f, tmp=tmp_path) for a in argv]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err, err
    assert sorted(p.name for p in tmp_path.iterdir()) == before


@pytest.mark.parametrize("argv,message", [
    (["sweep", "/dev/null", "--dry-run"], "grid file /dev/null is empty"),
    (["run", "--device", "cpu", "--draft", "eagle", "--spec-schedule", "{{4: [3, 1"],
     "cannot read --spec-schedule '{4: [3, 1': expected ',' or ']'"),
    (["sweep", "{g}", "--dry-run", "--set", "page_size=[1"], "the value of --set"),
], ids=["dev-null", "inline-schedule", "set-value"])
def test_inline_yaml_and_dev_null(tmp_path, capsys, argv, message):
    g = tmp_path / "g.yaml"
    g.write_text("base: {device: cpu}\n")
    assert _main([a.format(g=g) for a in argv]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err, err


def test_a_binary_journal_exits_2_in_one_line(tmp_path, capsys):
    g = tmp_path / "g.yaml"
    g.write_text("base: {page_size: 3, device: cpu}\narms: [{overlap: false}]\n")
    (tmp_path / "o").mkdir()
    (tmp_path / "o" / "results.jsonl").write_bytes(bytes(range(256)))
    assert _main(["sweep", str(g), "--out", str(tmp_path / "o"), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "results.jsonl is not a text file" in err, err
