"""The CLI's printing on its own: kubectl's ages, sizes, column layout, and the live progress on a terminal."""

from __future__ import annotations

import io

import pytest

from prewarm_cli.output import WatchDisplay, WatchState, human_age, human_bytes, object_name, table


@pytest.mark.parametrize(
    ("seconds", "shown"),
    [
        (-5, "<invalid>"), (0, "0s"), (119, "119s"), (120, "2m"), (125, "2m5s"), (600, "10m"), (179 * 60, "179m"),
        (3 * 3600, "3h"), (3 * 3600 + 60, "3h1m"), (8 * 3600, "8h"), (47 * 3600, "47h"), (2 * 86400, "2d"),
        (2 * 86400 + 3600, "2d1h"), (8 * 86400, "8d"), (729 * 86400, "729d"), (730 * 86400, "2y"),
        (731 * 86400, "2y1d"), (8 * 365 * 86400, "8y"),
    ],
)
def test_ages_read_as_kubectl_prints_them(seconds: float, shown: str) -> None:
    assert human_age(seconds) == shown


@pytest.mark.parametrize(
    ("count", "shown"),
    [(0, "0 B"), (1023, "1023 B"), (1024, "1.0 KiB"), (40 * 2**20, "40.0 MiB"), (3 * 2**30 // 2, "1.5 GiB"),
     (5 * 2**40, "5.0 TiB"), (2**60, "1048576.0 TiB")],
)
def test_sizes_use_binary_units(count: int, shown: str) -> None:
    assert human_bytes(count) == shown


def test_tables_align_columns_three_spaces_apart_without_trailing_blanks() -> None:
    text = table(["NAME", "TOTAL", "MESSAGE"], [["a-long-name", 3, ""], ["b", 12, "job has completed"]])

    assert text.splitlines() == [
        "NAME          TOTAL   MESSAGE",
        "a-long-name   3",
        "b             12      job has completed",
    ]


def test_names_are_kubectl_resource_slash_name_for_jobs_under_any_api_group() -> None:
    kinds = [
        {"apiVersion": "prewarm.dev/v1alpha1", "kind": "ImagePullJob", "metadata": {"name": "a"}},
        {"apiVersion": "apps.kruise.io/v1beta1", "kind": "ImageListPullJob", "metadata": {"name": "b"}},
        {"apiVersion": "prewarm.dev/v1alpha1", "kind": "PrewarmRule", "metadata": {"name": "c"}},
    ]

    assert [object_name(k) for k in kinds] == [
        "imagepulljob.apps.kruise.io/a", "imagelistpulljob.apps.kruise.io/b", "prewarmrule.prewarm.dev/c",
    ]


def test_on_a_terminal_watch_draws_progress_bars_for_nodes_and_bytes() -> None:
    # Given a terminal
    screen = io.StringIO()

    # When a job's progress is shown, then its outcome
    with WatchDisplay("ImagePullJob default/[web]", file=screen, terminal=True) as display:
        display.update(WatchState(desired=4, waiting=1, active=1, succeeded=2, failed=0, bytes_done=3 * 2**20,
                                  bytes_total=4 * 2**20))
        display.finish("ImagePullJob default/[web] completed: 4/4 nodes succeeded")

    # Then the bars show node counts and bytes, and the names are printed as they are (no markup)
    text = screen.getvalue()
    assert "watching ImagePullJob default/[web]" in text
    assert "2/4 (2 ok, 0 failed, 1 active, 1 waiting)" in text
    assert "3.0 MiB/4.0 MiB" in text
    assert "━" in text  # rich's bar
    assert text.rstrip().endswith("ImagePullJob default/[web] completed: 4/4 nodes succeeded")


def test_off_a_terminal_watch_prints_one_line_per_change() -> None:
    screen = io.StringIO()
    state = WatchState(desired=2, waiting=0, active=1, succeeded=1, failed=0, bytes_done=0, bytes_total=0)

    with WatchDisplay("ImagePullJob default/web", file=screen, terminal=False) as display:
        display.update(state)
        display.update(state)
        display.finish("done")

    assert screen.getvalue().splitlines() == [
        "ImagePullJob default/web: 1/2 nodes done (1 succeeded, 0 failed, 1 active, 0 waiting)",
        "done",
    ]
