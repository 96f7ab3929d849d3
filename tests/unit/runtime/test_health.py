"""The pure parts of pipeline.runtime.health: names, exposition text, listen addresses."""

from __future__ import annotations

import pytest

from pipeline.errors import ConfigError
from pipeline.runtime.health import Sample, counter_samples, metric_name, parse_listen, render


def test_metric_names_are_sanitized() -> None:
    assert metric_name("stream_service.pushes") == "stream_service_pushes"
    assert metric_name("9lives") == "_9lives"
    assert metric_name("..") == "unnamed"


def test_render_groups_help_type_and_escapes_labels() -> None:
    text = render(
        [
            Sample(name="x_total", value=3, kind="counter", help="things"),
            Sample(name="q", value=1.5, labels={"queue": 'a"b\\c'}),
            Sample(name="q", value=2, labels={"queue": "d"}),
            Sample(name="inf", value=float("inf")),
        ]
    )
    assert text.splitlines() == [
        "# HELP x_total things",
        "# TYPE x_total counter",
        "x_total 3",
        "# TYPE q gauge",
        'q{queue="a\\"b\\\\c"} 1.5',
        'q{queue="d"} 2',
        "# TYPE inf gauge",
        "inf +Inf",
    ]


def test_counter_samples_split_labelled_gauges() -> None:
    samples = counter_samples("sluice_node", {"handled": 4, "mailbox:echo": 2})
    assert [(s.name, s.kind, dict(s.labels), s.value) for s in samples] == [
        ("sluice_node_handled_total", "counter", {}, 4.0),
        ("sluice_node_mailbox", "gauge", {"name": "echo"}, 2.0),
    ]


@pytest.mark.parametrize(
    ("text", "want"),
    [("127.0.0.1:9100", ("127.0.0.1", 9100)), (":0", ("127.0.0.1", 0)), ("[::1]:80", ("::1", 80))],
)
def test_parse_listen(text: str, want: tuple[str, int]) -> None:
    assert parse_listen(text) == want


@pytest.mark.parametrize("text", ["9100", "host:", "host:port", "h:70000"])
def test_parse_listen_refuses(text: str) -> None:
    with pytest.raises(ConfigError):
        parse_listen(text)
