"""`prewarm cluster add` refuses, before it changes anything, a stack whose queue names cannot hold a
registered cluster's nodes."""

from __future__ import annotations

from typing import Any

import pytest

from prewarm_cli.clusters import RegistrationError, register_cluster


class Untouchable:
    """Any use of the stack, the table or the cluster fails the test: nothing may be done."""

    def __getattr__(self, name: str) -> Any:
        raise AssertionError(f"{name} was used")


class Stack(Untouchable):
    def __init__(self, prefix: str) -> None:
        self.env = {"NODE_QUEUE_PREFIX": prefix}


def test_a_queue_prefix_with_no_room_for_a_registered_clusters_queue_names_is_refused_first() -> None:
    # SQS names hold 80 characters; a registered cluster's queue names take 13 more than the own's
    with pytest.raises(RegistrationError, match=r"prefix '(p{58})' \(58 characters\).*shorter NodeQueuePrefix"):
        register_cluster(Stack("p" * 58), Untouchable(), "prod", {}, [], print, Untouchable())


def test_a_prefix_that_fits_goes_on_to_eks() -> None:
    with pytest.raises(AssertionError, match="get_cluster was used"):  # the table, read next
        register_cluster(Stack("p" * 57), Untouchable(), "prod", {}, [], print, Untouchable())
