"""The cold-start baseline: a dispatch handler written the usual way, everything built at import.

The typed Kubernetes client imported and its API class touched, Powertools' Logger, Metrics and
Tracer made, boto3 clients created at module level. `benchmarks/cold_start.py` measures only
its import; the handler is here so the module is what such a function really looks like.
"""

import json
import os
from typing import Any

import boto3
from aws_lambda_powertools import Logger, Metrics, Tracer
from kubernetes import client

logger = Logger()
metrics = Metrics()
tracer = Tracer()
dynamodb = boto3.client("dynamodb")
sqs = boto3.client("sqs")
core_api_class = client.CoreV1Api


def _core_api() -> Any:
    configuration = client.Configuration(host=os.environ["KUBE_API_ENDPOINT"])
    configuration.api_key = {"authorization": os.environ.get("KUBE_TOKEN", "")}
    configuration.api_key_prefix = {"authorization": "Bearer"}
    return core_api_class(client.ApiClient(configuration))


@logger.inject_lambda_context
@metrics.log_metrics
@tracer.capture_lambda_handler
def lambda_handler(event: dict[str, Any], context: Any) -> dict[str, Any]:
    """For each new job of the stream: list every node, write one item and send one task per node."""
    sent = 0
    for record in event.get("Records", []):
        image = record.get("dynamodb", {}).get("NewImage") or {}
        if image.get("sk", {}).get("S") != "JOB":
            continue
        spec = json.loads(image["spec"]["S"])
        wanted = (spec["spec"].get("selector") or {}).get("matchLabels") or {}
        for node in _core_api().list_node().items:
            labels = node.metadata.labels or {}
            if any(labels.get(k) != v for k, v in wanted.items()):
                continue
            name = node.metadata.name
            dynamodb.put_item(TableName=os.environ["TABLE_NAME"], Item={
                "pk": image["pk"], "sk": {"S": f"NODE#{name}"}, "kind": {"S": "task"}, "phase": {"S": "Waiting"}})
            queue = sqs.get_queue_url(QueueName=f"{os.environ['NODE_QUEUE_PREFIX']}-{name}")["QueueUrl"]
            sqs.send_message(QueueUrl=queue, MessageBody=json.dumps({"node": name, "image": spec["spec"]["image"]}))
            sent += 1
    return {"sent": sent}
