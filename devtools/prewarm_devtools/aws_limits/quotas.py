"""The AWS quotas the limits layer enforces, as one small dataclass; the defaults are AWS's numbers."""

from __future__ import annotations

from dataclasses import dataclass

KIB = 1024
MIB = 1024 * KIB


@dataclass(frozen=True)
class Quotas:
    """What AWS allows and moto does not check. Change one for a test with `dataclasses.replace`.

    >>> Quotas(partition_wcu_per_s=10).partition_wcu_per_s
    10.0
    """

    # DynamoDB "Service, account, and table quotas": "The maximum item size in DynamoDB is 400 KB,
    # which includes both attribute name binary length (UTF-8 length) and attribute value lengths".
    item_bytes: int = 400 * KIB
    # TransactWriteItems: "can contain up to 100 action requests" and "The aggregate size of the items
    # in the transaction cannot exceed 4 MB".
    transaction_actions: int = 100
    transaction_bytes: int = 4 * MIB
    # How long a transaction holds its items on AWS (two-phase commit, about 10 ms): a second
    # transaction or single write on one of them in that time is refused with TransactionConflict.
    # Each transaction lasts at least this long here, so a caller that waits for the answer of one
    # never conflicts with itself; only concurrent callers do.
    transaction_hold_s: float = 0.01
    # "Partitions": "each partition can support a maximum of 3,000 read capacity units (RCUs) or
    # 1,000 write capacity units (WCUs)" per second, for the base table and each GSI.
    partition_wcu_per_s: float = 1000.0
    partition_rcu_per_s: float = 3000.0
    # SQS "Message quotas": a queue's MaximumMessageSize defaults to 262,144 bytes (256 KiB), which
    # holds unless the queue sets its own; a batch holds "up to 10 messages". AWS raised the ceiling of
    # MaximumMessageSize and of a batch's total to 1 MiB in 2025; 256 KiB is the default either way.
    sqs_message_bytes: int = 256 * KIB
    sqs_batch_bytes: int = 256 * KIB
    sqs_batch_entries: int = 10
    # CreateQueue: "After you delete a queue, you must wait at least 60 seconds before creating a
    # queue with the same name" (QueueDeletedRecently).
    sqs_queue_name_reuse_s: float = 60.0
    # ECR "Amazon ECR service quotas", per account and Region (Service Quotas L-55A41110, L-16E70933,
    # L-A60A366D): GetAuthorizationToken 500/s, BatchGetImage (a manifest request) 2,000/s,
    # GetDownloadUrlForLayer (a blob request) 3,000/s. ECR states rates only; the burst here is one
    # second's worth. A machine serves far less: local mode and tests lower them to make them bite.
    ecr_auth_per_s: float = 500.0
    ecr_auth_burst: int = 500
    ecr_manifest_per_s: float = 2000.0
    ecr_layer_per_s: float = 3000.0
    # Seconds a 429 names in `Retry-After`; None sends none (ECR documents none).
    ecr_retry_after_s: int | None = None
    # DynamoDB Streams: "data in a stream is retained for 24 hours"; a shard iterator "expires 15
    # minutes after it is returned to the requester".
    stream_retention_s: float = 24 * 3600.0
    shard_iterator_s: float = 15 * 60.0

    def __post_init__(self) -> None:
        for name in ("partition_wcu_per_s", "partition_rcu_per_s", "ecr_auth_per_s", "ecr_manifest_per_s",
                     "ecr_layer_per_s"):
            object.__setattr__(self, name, float(getattr(self, name)))
