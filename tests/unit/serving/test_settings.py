"""Tests for services.serving.settings: defaults, env/flag precedence, type parsing, errors, subclasses."""

# No `from __future__ import annotations` here: the test settings class below is resolved by
# typing.get_type_hints, and real annotation objects keep that independent of how pytest imports us.

import dataclasses

import pytest

from services.serving.settings import Device, LogFormat, ModelStageSettings, ServiceSettings, parse_settings, setting


@dataclasses.dataclass(frozen=True)
class _ExtraSettings(ServiceSettings):
    """Settings with field types the base class does not use."""

    debug: bool = setting(False, "a boolean")
    sizes: tuple[int, ...] = setting((1, 2), "a comma-separated list")
    limit: int | None = setting(None, "an optional int")
    ratio: float = setting(0.5, "a float")


def test_defaults_without_env_or_flags() -> None:
    s = parse_settings(ServiceSettings, [], {})
    assert s == ServiceSettings()
    assert s.host == "0.0.0.0"
    assert s.port == 50051
    assert s.metrics_port == 9090
    assert s.log_format is LogFormat.JSON
    assert s.device is Device.AUTO
    assert s.grace_s == 20.0


def test_env_variable_sets_a_field() -> None:
    s = parse_settings(ServiceSettings, [], {"LIPLINE_PORT": "6000", "LIPLINE_GRACE_S": "1.5"})
    assert s.port == 6000
    assert isinstance(s.port, int)
    assert s.grace_s == 1.5


def test_flag_sets_a_field() -> None:
    s = parse_settings(ServiceSettings, ["--port", "7000", "--max-connection-age-s", "12"], {})
    assert s.port == 7000
    assert s.max_connection_age_s == 12.0


def test_flag_wins_over_env() -> None:
    s = parse_settings(ServiceSettings, ["--port", "7000"], {"LIPLINE_PORT": "6000"})
    assert s.port == 7000


def test_env_applies_where_no_flag_is_given() -> None:
    s = parse_settings(ServiceSettings, ["--port", "7000"], {"LIPLINE_PORT": "6000", "LIPLINE_HOST": "127.0.0.1"})
    assert (s.port, s.host) == (7000, "127.0.0.1")


def test_unrelated_env_variables_are_ignored() -> None:
    s = parse_settings(ServiceSettings, [], {"PORT": "1", "LIPLINE_NOT_A_FIELD": "x"})
    assert s.port == 50051


def test_enum_parsing_from_flags() -> None:
    s = parse_settings(ServiceSettings, ["--device", "cuda", "--log-format", "text"], {})
    assert s.device is Device.CUDA
    assert s.log_format is LogFormat.TEXT


def test_enum_parsing_from_env_is_case_insensitive() -> None:
    s = parse_settings(ServiceSettings, [], {"LIPLINE_DEVICE": "CPU", "LIPLINE_LOG_FORMAT": "Text"})
    assert s.device is Device.CPU
    assert s.log_format is LogFormat.TEXT


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ("1", True),
        ("true", True),
        ("Yes", True),
        ("ON", True),
        ("0", False),
        ("false", False),
        ("no", False),
        ("off", False),
        ("", False),
    ],
)
def test_bool_parsing(raw: str, expected: bool) -> None:
    assert parse_settings(_ExtraSettings, [], {"LIPLINE_DEBUG": raw}).debug is expected
    assert parse_settings(_ExtraSettings, ["--debug", raw], {}).debug is expected


def test_tuple_optional_and_float_parsing() -> None:
    s = parse_settings(_ExtraSettings, ["--sizes", "3, 4,5", "--limit", "9"], {"LIPLINE_RATIO": "0.25"})
    assert s.sizes == (3, 4, 5)
    assert s.limit == 9
    assert s.ratio == 0.25
    defaults = parse_settings(_ExtraSettings, [], {})
    assert (defaults.debug, defaults.sizes, defaults.limit) == (False, (1, 2), None)


def test_bad_env_value_exits_naming_the_variable(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        parse_settings(ServiceSettings, [], {"LIPLINE_PORT": "abc"})
    assert info.value.code != 0
    err = capsys.readouterr().err
    assert "LIPLINE_PORT" in err
    assert "abc" in err


def test_bad_flag_value_exits_naming_the_flag(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        parse_settings(ServiceSettings, ["--device", "tpu"], {})
    assert info.value.code != 0
    err = capsys.readouterr().err
    assert "--device" in err
    assert "tpu" in err
    assert "cuda" in err  # the allowed values are listed


def test_bad_bool_exits_naming_the_variable(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        parse_settings(_ExtraSettings, [], {"LIPLINE_DEBUG": "maybe"})
    err = capsys.readouterr().err
    assert "LIPLINE_DEBUG" in err
    assert "maybe" in err


def test_unknown_flag_exits(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        parse_settings(ServiceSettings, ["--no-such-flag", "1"], {})
    assert "--no-such-flag" in capsys.readouterr().err


def test_flag_error_wins_even_when_env_is_valid(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        parse_settings(ServiceSettings, ["--port", "x"], {"LIPLINE_PORT": "6000"})
    assert "--port" in capsys.readouterr().err


def test_validate_accepts_defaults() -> None:
    ServiceSettings().validate()


def test_validate_lists_every_problem() -> None:
    bad = ServiceSettings(port=70000, max_message_bytes=10, grace_s=-1, log_level="chatty")
    with pytest.raises(ValueError) as info:
        bad.validate()
    message = str(info.value)
    assert "port 70000" in message
    assert "max_message_bytes" in message
    assert "grace_s" in message
    assert "chatty" in message


def test_validate_accepts_lower_case_log_level() -> None:
    ServiceSettings(log_level="debug").validate()


def test_validation_failure_exits_with_the_message(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        parse_settings(ServiceSettings, ["--port", "-5"], {})
    assert "port -5 is not in 0..65535" in capsys.readouterr().err


def test_settings_are_frozen() -> None:
    s = ServiceSettings()
    with pytest.raises(dataclasses.FrozenInstanceError):
        s.port = 1  # type: ignore[misc]  # on purpose: the test assigns to a frozen field


def test_service_subclass_adds_fields_with_the_same_mechanism() -> None:
    from services.audio.settings import AudioSettings

    defaults = parse_settings(AudioSettings, [], {})
    assert defaults.port == 50061  # the subclass overrides the base default
    assert defaults.max_audio_seconds == 900.0
    s = parse_settings(
        AudioSettings,
        ["--max-audio-seconds", "30", "--device", "cpu"],
        {"LIPLINE_MAX_AUDIO_BYTES": "1234", "LIPLINE_MAX_AUDIO_SECONDS": "99", "LIPLINE_PORT": "6001"},
    )
    assert isinstance(s, AudioSettings)
    assert s.max_audio_bytes == 1234
    assert s.max_audio_seconds == 30.0  # flag wins over env for subclass fields too
    assert s.port == 6001
    assert s.device is Device.CPU


def test_help_names_flags_and_env_variables(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        parse_settings(ServiceSettings, ["--help"], {})
    assert info.value.code == 0
    out = capsys.readouterr().out
    assert "--metrics-port" in out
    assert "LIPLINE_METRICS_PORT" in out


def test_model_stage_settings_are_shared_and_checked() -> None:
    """lipsync and superres take the same batching/backend settings, from one class."""
    from services.lipsync.settings import LipSyncSettings
    from services.superres.settings import SuperResSettings

    for cls in (LipSyncSettings, SuperResSettings):
        assert issubclass(cls, ModelStageSettings)
        names = {f.name for f in dataclasses.fields(cls)}
        assert {"pipeline_depth", "batch_buckets", "compile_cache_dir", "max_rel_error", "backend"} <= names
    ModelStageSettings(max_batch=64, batch_buckets=(16, 64)).validate()
    with pytest.raises(ValueError) as err:
        ModelStageSettings(max_batch=64, batch_buckets=(16, 128), pipeline_depth=-1).validate()
    assert "batch_buckets [16, 128] must lie in 1..max_batch (64)" in str(err.value)
    assert "pipeline_depth must be >= 0" in str(err.value)
