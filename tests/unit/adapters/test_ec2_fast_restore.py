"""`Ec2Builders.disable_fast_restore`: EC2 answers a refusal per snapshot and zone in `Unsuccessful`, not as an
error; a refusal the clean-up took for done would leave FSR billed and recorded off."""

from __future__ import annotations

from typing import Any

import pytest

from prewarm.adapters.ec2 import Ec2Builders
from prewarm.services.snapshot_ports import BakeError


class Ec2Answering:
    """An EC2 client whose DisableFastSnapshotRestores answers `unsuccessful` (its error messages)."""

    def __init__(self, *messages: str) -> None:
        self.messages = messages

    def disable_fast_snapshot_restores(self, **kwargs: Any) -> dict[str, Any]:
        unsuccessful = [{"SnapshotId": "snap-1", "FastSnapshotRestoreStateErrors": [
            {"AvailabilityZone": "us-west-2a", "Error": {"Code": m.split(":")[0], "Message": m}}
            for m in self.messages]}]
        return {"Successful": [], "Unsuccessful": unsuccessful if self.messages else []}


def builders(*messages: str) -> Ec2Builders:
    return Ec2Builders("pw", "arn:aws:iam::123456789012:instance-profile/b", client=Ec2Answering(*messages))


def test_a_refused_disable_is_raised_so_the_clean_up_still_owes_it() -> None:
    with pytest.raises(BakeError, match=r"not disabled: .*UnauthorizedOperation"):
        builders("UnauthorizedOperation: not allowed").disable_fast_restore("snap-1", ["us-west-2a"])


@pytest.mark.parametrize("message", ["", "Fast snapshot restores are not enabled for snap-1 in us-west-2a",
                                     "The snapshot is already disabled",
                                     "InvalidSnapshot.NotFound: The snapshot 'snap-1' does not exist."])
def test_a_zone_where_fsr_is_already_off_is_done(message: str) -> None:
    builders(*([message] if message else [])).disable_fast_restore("snap-1", ["us-west-2a"])
