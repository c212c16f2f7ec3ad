"""A job's key (`domain/keys.py`): its cluster, namespace and name, with the text tables and queues hold."""

from __future__ import annotations

import copy
import json
import pickle

import pytest

from prewarm.domain.jobs import job_key
from prewarm.domain.keys import JobKey


def test_a_keys_text_is_the_one_tables_and_queues_have_always_held() -> None:
    assert JobKey("ml", "web") == "ml/web" and str(JobKey("ml", "web")) == "ml/web"
    assert JobKey("ml", "web", "prod-eu") == "prod-eu:ml/web"
    assert json.dumps({"job": JobKey("ml", "web", "prod-eu")}) == '{"job": "prod-eu:ml/web"}'
    # A key finds what its text keys, and the other way round
    assert {"prod-eu:ml/web": 1}[JobKey("ml", "web", "prod-eu")] == 1
    assert job_key("ml", "web", "prod-eu") == JobKey("ml", "web", "prod-eu")


def test_a_key_answers_for_its_parts_without_reading_its_text() -> None:
    key = JobKey("ml", "web", "prod-eu")
    assert (key.cluster, key.namespace, key.name) == ("prod-eu", "ml", "web")
    assert JobKey("ml", "web").cluster == ""
    sibling = key.sibling("web-1")
    assert (sibling, sibling.cluster, sibling.namespace) == ("prod-eu:ml/web-1", "prod-eu", "ml")


def test_copies_and_pickles_keep_the_parts() -> None:
    key = JobKey("ml", "web", "prod-eu")
    for again in (copy.copy(key), copy.deepcopy(key), pickle.loads(pickle.dumps(key))):
        assert isinstance(again, JobKey) and (again, again.cluster, again.name) == (key, "prod-eu", "web")


def test_a_key_that_comes_in_as_text_is_parsed_once_where_it_comes_in() -> None:
    assert JobKey.parse("ml/web") == JobKey("ml", "web") and JobKey.parse("ml/web").cluster == ""
    parsed = JobKey.parse("prod-eu:ml/web")
    assert (parsed.cluster, parsed.namespace, parsed.name) == ("prod-eu", "ml", "web")
    key = JobKey("ml", "web")
    assert JobKey.parse(key) is key
    for text in ("web", "ml/", "/web", "prod-eu:web", ""):
        with pytest.raises(ValueError, match="is not a job key"):
            JobKey.parse(text)
