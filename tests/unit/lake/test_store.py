"""Storage options of a lake on object storage: one translation, the secret never shown."""

from __future__ import annotations

import pytest

from pipeline.errors import ConfigError
from pipeline.lake.storage import store
from pipeline.settings import LakeSettings, Settings

S3 = {
    "lake_uri": "s3://bucket/lake",
    "lake_s3_endpoint": "http://127.0.0.1:9000",
    "lake_s3_allow_http": "true",
    "lake_s3_access_key": "AKIDEXAMPLE",
    "lake_s3_secret_key": "wJalrXUtnFEMI-very-secret",
}


def test_options_from_the_environment() -> None:
    lake = Settings.load(env={"SLUICE_" + k.upper(): v for k, v in S3.items()}).lake
    assert lake.remote
    assert lake.storage_options() == {
        "AWS_REGION": "us-east-1",
        "AWS_VIRTUAL_HOSTED_STYLE_REQUEST": "false",
        "AWS_ALLOW_HTTP": "true",
        "AWS_CONDITIONAL_PUT": "etag",
        "AWS_ENDPOINT_URL": "http://127.0.0.1:9000",
        "AWS_ACCESS_KEY_ID": "AKIDEXAMPLE",
        "AWS_SECRET_ACCESS_KEY": "wJalrXUtnFEMI-very-secret",
        "timeout": "30s",
        "connect_timeout": "10s",
        "max_retries": "2",
        "retry_timeout": "30s",
    }


def test_the_secret_is_not_in_any_repr() -> None:
    settings = Settings.load(env={}, **S3)
    assert "very-secret" not in repr(settings)
    assert "very-secret" not in repr(settings.lake)
    assert "AKIDEXAMPLE" in repr(settings.lake)  # the key id is not a secret


def test_a_local_lake_has_no_options() -> None:
    lake = LakeSettings(uri="/tmp/lake", s3_access_key="x", s3_secret_key="y")
    assert not lake.remote
    assert lake.storage_options() == {}
    assert store.delta_options(lake) is None


def test_unsafe_rename_is_said_out_loud() -> None:
    options = LakeSettings(uri="s3://b/l", s3_conditional_put="unsafe-rename").storage_options()
    assert options["AWS_S3_ALLOW_UNSAFE_RENAME"] == "true"
    assert "AWS_CONDITIONAL_PUT" not in options
    assert "AWS_ACCESS_KEY_ID" not in options  # no key set: the AWS_* environment's


@pytest.mark.parametrize(
    ("changes", "problem"),
    [
        ({"uri": "gs://bucket/lake"}, "s3://bucket/prefix"),
        ({"uri": "s3:///lake"}, "names no bucket"),
        ({"uri": "s3://b/l", "s3_endpoint": "http://h:1"}, "lake_s3_allow_http"),
        ({"uri": "s3://b/l", "s3_endpoint": "h:1"}, "http\\(s\\)://host:port"),
        ({"uri": "s3://b/l", "s3_conditional_put": "none"}, "etag or unsafe-rename"),
    ],
)
def test_bad_object_store_settings_are_refused(changes: dict[str, str], problem: str) -> None:
    with pytest.raises(ConfigError, match=problem):
        LakeSettings(**changes)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("Generic S3 error: error sending request ... tcp connect error: Connection refused",
         "refused the connection"),
        ("Generic S3 error: NoSuchBucket: The specified bucket does not exist", "bucket"),
        ("Error: InvalidAccessKeyId: The access key ID you provided does not exist", "access"),
        ("AWS Error ACCESS_DENIED during HeadBucket operation: 403 Forbidden", "access"),
    ],
)  # fmt: skip
def test_describe_says_why_in_one_line(text: str, reason: str) -> None:
    assert reason in store.describe(OSError(text))
    assert "\n" not in store.describe(OSError(text + "\nsecond line"))
