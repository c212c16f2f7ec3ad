"""Reads `template.yaml`, the same file that deploys to AWS, so local runs and tests share its wiring; and
expands it to CloudFormation as SAM does, with aws-sam-translator, the library `sam` itself runs.

CloudFormation's short tags (`!Ref`, `!Sub`, `!GetAtt`, ...) load as their long JSON forms
(`{"Ref": ...}`, `{"Fn::Sub": ...}`), by SAM's own constructor, so the result looks like the template
in JSON. `sam_transform` gives what a deploy hands CloudFormation: each `AWS::Serverless::Function` as
an `AWS::Lambda::Function` with the template's Globals merged in and the role SAM makes for a function
that names none, and its events as the event source mappings, rules and schedules SAM generates.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import boto3
import yaml
from samtranslator.model.exceptions import InvalidDocumentException
from samtranslator.parser.parser import Parser
from samtranslator.translator.translator import Translator
from samtranslator.yaml_helper import intrinsics_multi_constructor

from prewarm_devtools.project import project_files

# The bucket an unpackaged template's local code paths are given for the transform (SAM accepts only S3
# locations there), as `sam validate` and cfn-lint do; `local_code_path` reads the path back.
_LOCAL_BUCKET = "local"


class TemplateError(ValueError):
    """The template lacks something local mode needs, or has it in a shape it cannot use."""


class _CfnLoader(yaml.SafeLoader):
    """PyYAML's safe loader with SAM's constructor for CloudFormation's short tags. A loader of its own:
    samtranslator's `yaml_parse` registers the constructor on PyYAML's SafeLoader, for every caller."""


_CfnLoader.add_multi_constructor("!", intrinsics_multi_constructor)


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


def sam_transform(template: Mapping[str, Any], *, region: str, account: str) -> dict[str, Any]:
    """The template as SAM hands it to CloudFormation, expanded offline: no AWS call (no managed policy
    names to look up: the template names managed policies by ARN)."""
    document = copy.deepcopy(dict(template))
    for res in document.get("Resources", {}).values():
        props = res.get("Properties", {})
        for key in ("CodeUri", "ContentUri"):
            if isinstance(props.get(key), str) and not props[key].startswith("s3://"):
                props[key] = f"s3://{_LOCAL_BUCKET}/{props[key]}"
    translator = Translator(None, Parser(), boto_session=boto3.session.Session(region_name=region))
    try:
        cloudformation: dict[str, Any] = translator.translate(
            document, {"AWS::AccountId": account, "AWS::Region": region}, get_managed_policy_map=lambda: {})
    except InvalidDocumentException as e:
        raise TemplateError(f"SAM rejects the template: {e.message}") from e
    return cloudformation


def local_code_path(code: Mapping[str, Any]) -> str:
    """The local path of a transformed function's `Code` (its CodeUri in the template)."""
    if code.get("S3Bucket") != _LOCAL_BUCKET or not code.get("S3Key"):
        raise TemplateError(f"function code {dict(code)} is not a local path of the template")
    return str(code["S3Key"])


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
