"""Reads `template.yaml`, the same file that deploys to AWS, so local runs and tests share its wiring.

CloudFormation's short tags (`!Ref`, `!Sub`, `!GetAtt`, ...) load as their long JSON forms
(`{"Ref": ...}`, `{"Fn::Sub": ...}`), so the result looks like the template in JSON.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from prewarm_devtools.project import project_files


class TemplateError(ValueError):
    """The template lacks something local mode needs, or has it in a shape it cannot use."""


class _CfnLoader(yaml.SafeLoader):
    pass


def _intrinsic(name: str) -> Any:
    def construct(loader: yaml.SafeLoader, node: yaml.Node) -> dict[str, Any]:
        if isinstance(node, yaml.ScalarNode):
            value: Any = loader.construct_scalar(node)
            if name == "Fn::GetAtt" and isinstance(value, str):
                value = value.split(".", 1)
        elif isinstance(node, yaml.SequenceNode):
            value = loader.construct_sequence(node, deep=True)
        else:
            value = loader.construct_mapping(node, deep=True)  # type: ignore[arg-type]
        return {name: value}

    return construct


for _tag, _name in {
    "!Ref": "Ref", "!Sub": "Fn::Sub", "!GetAtt": "Fn::GetAtt", "!If": "Fn::If", "!Equals": "Fn::Equals",
    "!Not": "Fn::Not", "!And": "Fn::And", "!Or": "Fn::Or", "!Join": "Fn::Join", "!Select": "Fn::Select",
    "!Split": "Fn::Split", "!FindInMap": "Fn::FindInMap", "!ImportValue": "Fn::ImportValue",
    "!Condition": "Condition", "!Base64": "Fn::Base64", "!GetAZs": "Fn::GetAZs", "!Cidr": "Fn::Cidr",
}.items():
    _CfnLoader.add_constructor(_tag, _intrinsic(_name))


def __getattr__(name: str) -> Path:
    """`ROOT` and `TEMPLATE`, looked up when first read (see `prewarm_devtools.project`)."""
    if name == "ROOT":
        return project_files().root
    if name == "TEMPLATE":
        return project_files().template
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def load_template(path: Path | str | None = None) -> dict[str, Any]:
    """The template at `path`, the project's own `template.yaml` by default."""
    path = project_files().template if path is None else path
    with open(path, encoding="utf-8") as f:
        doc = yaml.load(f, Loader=_CfnLoader)
    if not isinstance(doc, dict) or "Resources" not in doc:
        raise TemplateError(f"{path}: not a CloudFormation template (no Resources)")
    return doc


def resource(template: dict[str, Any], logical_id: str, expected_type: str) -> dict[str, Any]:
    res = template["Resources"].get(logical_id)
    if res is None:
        raise TemplateError(f"template has no resource {logical_id}")
    if res.get("Type") != expected_type:
        raise TemplateError(f"{logical_id} is a {res.get('Type')}, expected {expected_type}")
    props: dict[str, Any] = res.get("Properties", {})
    return props


def table_create_args(template: dict[str, Any], table_name: str, logical_id: str = "JobsTable") -> dict[str, Any]:
    """`CreateTable` arguments for the template's table, under `table_name`."""
    props = resource(template, logical_id, "AWS::DynamoDB::Table")
    args: dict[str, Any] = {
        "TableName": table_name,
        "AttributeDefinitions": props["AttributeDefinitions"],
        "KeySchema": props["KeySchema"],
        "BillingMode": props.get("BillingMode", "PAY_PER_REQUEST"),
    }
    if props.get("GlobalSecondaryIndexes"):
        args["GlobalSecondaryIndexes"] = props["GlobalSecondaryIndexes"]
    if props.get("StreamSpecification"):
        args["StreamSpecification"] = {"StreamEnabled": True, **props["StreamSpecification"]}
    return args


def create_table(client: Any, template: dict[str, Any], table_name: str, logical_id: str = "JobsTable") -> None:
    """Creates the table as the template defines it (keys, indexes, stream, TTL) and waits for it."""
    client.create_table(**table_create_args(template, table_name, logical_id))
    client.get_waiter("table_exists").wait(TableName=table_name, WaiterConfig={"Delay": 0.05, "MaxAttempts": 200})
    ttl = resource(template, logical_id, "AWS::DynamoDB::Table").get("TimeToLiveSpecification")
    if ttl and ttl.get("Enabled"):
        client.update_time_to_live(
            TableName=table_name,
            TimeToLiveSpecification={"Enabled": True, "AttributeName": ttl["AttributeName"]},
        )
