"""The config file and its environment overrides: every bad value is a ConfigError naming
the file (or the variable) and the key, never a traceback or a silent coercion."""

from __future__ import annotations

from pathlib import Path

import pytest

from promptdistill.cli import main
from promptdistill.core.config import MAX_CONFIG_BYTES, EngineConfig, default_dtype, load_settings
from promptdistill.core.errors import ConfigError


def _config(tmp_path: Path, text: str | bytes) -> Path:
    path = tmp_path / "promptdistill.toml"
    path.write_bytes(text if isinstance(text, bytes) else text.encode())
    return path


@pytest.mark.parametrize(
    "text, message",
    [
        ("engine = 5\n", "engine: must be a table ([engine]), got int"),
        ("paths = 'x'\n", "paths: must be a table ([paths]), got str"),
        ("[paths]\nstate_dir = [1, 2]\n", "paths.state_dir: must be a non-empty path or URL string, got [1, 2]"),
        ('[paths]\nregistry = ""\n', "paths.registry: must be a non-empty path or URL string, got ''"),
        ('[paths]\njudges = "  "\n', "paths.judges: must be a non-empty path"),
        ("[engine]\nkv_cache_gib = nan\n", "engine.kv_cache_gib: must be a finite number, got nan"),
        ("[engine]\nkv_cache_gib = 0\n", "engine.kv_cache_gib: must be > 0.0"),
        ("[engine]\ntimeout_s = inf\n", "engine.timeout_s: must be a finite number, got inf"),
        ("[engine]\ngpu_memory_utilization = 1.5\n", "engine.gpu_memory_utilization: must be in (0.0, 1.0]"),
        ("[engine]\nmax_model_len = 2048.9\n", "engine.max_model_len: expected int (an integer), got 2048.9"),
        ("[engine]\nmax_model_len = true\n", "engine.max_model_len: expected int"),
        ("[engine]\nmax_model_len = 8\n", "engine.max_model_len: must be at least 64, got 8"),
        ("[engine]\nmax_concurrency = 0\n", "engine.max_concurrency: must be at least 1"),
        ("[engine]\nenforce_eager = 2\n", "engine.enforce_eager: expected bool (true or false), got 2"),
        ("[engine]\nenforce_eager = 'yes'\n", "engine.enforce_eager: expected bool"),
        ("[engine]\nserver_urls = [1, 2]\n", "engine.server_urls: expected a list of strings, got [1, 2]"),
        ('[engine]\nserver_urls = ["ftp://x"]\n', "engine.server_urls: 'ftp://x' is not an http(s) URL"),
        ('[engine]\nserver_urls = ["http://h:port/v1"]\n', "engine.server_urls: 'http://h:port/v1' is not a URL"),
        ('[engine]\nbackend = "server"\nserver_urls = []\n', "engine.server_urls: the server backend needs at least one URL"),
        ('[engine]\ndtype = "float99"\n', "engine.dtype: must be one of"),
        ("[engine]\nmodel = 12\n", "engine.model: expected str (a string), got 12"),
        ('[engine]\nmodel = ""\n', "engine.model: must be a non-empty string"),
        ('[engine]\nserved_model_name = " "\n', "engine.served_model_name: must be a non-empty string"),
        ("[engine]\nseed = 1.5\n", "engine.seed: expected int"),
        ('[engine]\nbackend = "gpu"\n', "engine.backend: must be one of ('local', 'server'), got 'gpu'"),
        ("[engine]\nmodle = 'x'\n", "engine.modle: unknown key"),
        ("[paths]\nregistri = 'x'\n", "paths.registri: unknown key"),
        ("[engin]\n", "unknown section(s) ['engin']"),
        ("[engine\n", "not valid TOML"),
        ("a = " + "[" * 100_000 + "]" * 100_000 + "\n", "not valid TOML: nested too deeply"),
        (b"[engine]\nmodel = '\xff\xfe'\n", "not UTF-8 text (byte 0xff at offset 18)"),
        ("# " + "x" * MAX_CONFIG_BYTES + "\n", "larger than 256 KiB"),
    ],
)
def test_every_bad_value_names_the_file_and_the_key(tmp_path, text, message):
    path = _config(tmp_path, text)
    with pytest.raises(ConfigError) as info:
        load_settings(path, env={})
    assert str(info.value).startswith(f"{path}: ") and message in str(info.value), str(info.value)


@pytest.mark.parametrize(
    "env, message",
    [
        ({"PROMPTDISTILL_BACKEND": "gpu"}, "$PROMPTDISTILL_BACKEND: engine.backend: must be one of"),
        ({"PROMPTDISTILL_TIMEOUT_S": "soon"}, "$PROMPTDISTILL_TIMEOUT_S: engine.timeout_s: expected float"),
        ({"PROMPTDISTILL_TIMEOUT_S": "nan"}, "$PROMPTDISTILL_TIMEOUT_S: engine.timeout_s: must be a finite number"),
        ({"PROMPTDISTILL_MAX_MODEL_LEN": "2048.9"}, "$PROMPTDISTILL_MAX_MODEL_LEN: engine.max_model_len: expected int"),
        ({"PROMPTDISTILL_MAX_MODEL_LEN": "２０４８"}, "$PROMPTDISTILL_MAX_MODEL_LEN: engine.max_model_len: expected int"),
        ({"PROMPTDISTILL_ENFORCE_EAGER": "2"}, "$PROMPTDISTILL_ENFORCE_EAGER: engine.enforce_eager: expected bool"),
        ({"PROMPTDISTILL_SERVER_URLS": "not a url"}, "$PROMPTDISTILL_SERVER_URLS: engine.server_urls:"),
        ({"PROMPTDISTILL_REGISTRY": ""}, "$PROMPTDISTILL_REGISTRY: paths.registry: must be a non-empty"),
        ({"PROMPTDISTILL_CONFIG": "/nonexistent/pd.toml"}, "$PROMPTDISTILL_CONFIG (/nonexistent/pd.toml): config file not found"),
    ],
)
def test_a_bad_environment_override_is_blamed_on_the_variable(tmp_path, env, message):
    _config(tmp_path, '[engine]\nbackend = "local"\n')  # a good file: it must not be blamed
    path = None if "PROMPTDISTILL_CONFIG" in env else tmp_path / "promptdistill.toml"
    with pytest.raises(ConfigError) as info:
        load_settings(path, env=env)
    assert str(info.value).startswith(message), str(info.value)


def test_good_values_and_overrides(tmp_path):
    path = _config(tmp_path, '[engine]\nbackend = "server"\nkv_cache_gib = 2\nenforce_eager = false\n'
                             'server_urls = ["http://a:1/v1"]\n[paths]\nregistry = "s3://b/r"\n')
    s = load_settings(path, env={"PROMPTDISTILL_ENFORCE_EAGER": "yes", "PROMPTDISTILL_SEED": "-3"})
    assert s.engine.kv_cache_gib == 2.0 and isinstance(s.engine.kv_cache_gib, float)
    assert s.engine.enforce_eager is True and s.engine.seed == -3
    assert s.registry == "s3://b/r" and s.source == str(path)
    assert load_settings(None, env={"PROMPTDISTILL_CONFIG": str(path)}).engine.backend == "server"


def test_a_config_path_that_is_a_directory_is_an_error(tmp_path):
    with pytest.raises(ConfigError, match=r"not a config file \(a directory\)"):
        load_settings(tmp_path, env={})


def test_engine_config_built_in_code_is_checked_too():
    with pytest.raises(ConfigError, match="engine.max_model_len: must be an integer, got 2048.9"):
        EngineConfig(max_model_len=2048.9).validate()  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="engine.server_urls: every URL must be a string"):
        EngineConfig(server_urls=(1, 2)).validate()  # type: ignore[arg-type]


def test_cli_exits_2_naming_the_file_and_key(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("PROMPTDISTILL_REGISTRY", raising=False)
    path = _config(tmp_path, "[engine]\nkv_cache_gib = nan\n")
    assert main(["--config", str(path), "templates", "list"]) == 2
    assert f"ConfigError: {path}: engine.kv_cache_gib: must be a finite number" in capsys.readouterr().err
    path.write_text('[paths]\nregistry = "foo://x"\n')
    assert main(["--config", str(path), "templates", "list"]) == 2
    assert f"ConfigError: {path}: paths.registry: foo://x: unknown storage protocol 'foo'" in capsys.readouterr().err
    assert main(["templates", "list", "--root", "foo://x"]) == 2
    assert "ConfigError: --root: foo://x: unknown storage protocol 'foo'" in capsys.readouterr().err


def test_a_judge_section_configures_a_separate_judge_engine(tmp_path):
    from promptdistill.core.config import load_settings

    assert load_settings(env={}).judge is None  # default: the task engine judges
    config = tmp_path / "promptdistill.toml"
    config.write_text('[engine]\nbackend = "local"\n\n[judge]\nbackend = "server"\n'
                      'server_urls = ["http://127.0.0.1:9000/v1"]\nserved_model_name = "big-judge"\n')
    settings = load_settings(config, env={})
    assert settings.engine.backend == "local"
    assert (settings.judge.backend, settings.judge.server_urls, settings.judge.served_model_name) == (
        "server", ("http://127.0.0.1:9000/v1",), "big-judge")
    env = {"PROMPTDISTILL_JUDGE_SERVED_MODEL_NAME": "other"}
    assert load_settings(config, env=env).judge.served_model_name == "other"


def test_a_bad_judge_key_names_the_judge_section(tmp_path):
    import pytest

    from promptdistill.core.config import load_settings
    from promptdistill.core.errors import ConfigError

    config = tmp_path / "promptdistill.toml"
    config.write_text('[judge]\nbackend = "gpu"\n')
    with pytest.raises(ConfigError, match=r"promptdistill.toml: judge.backend: must be one of"):
        load_settings(config, env={})
    with pytest.raises(ConfigError, match=r"\$PROMPTDISTILL_JUDGE_TIMEOUT_S: judge.timeout_s"):
        load_settings(env={"PROMPTDISTILL_JUDGE_TIMEOUT_S": "soon"})


def test_the_default_dtype_is_bfloat16_only_where_the_cpu_computes_it(tmp_path):
    native = tmp_path / "native"
    native.write_text("processor\t: 0\nflags\t\t: fpu sse2 avx2 avx512f avx512_bf16 amx_tile\n")
    amx = tmp_path / "amx"
    amx.write_text("flags\t\t: fpu avx2 avx512f amx_bf16\n")
    emulated = tmp_path / "emulated"
    emulated.write_text("flags\t\t: fpu sse2 avx2 avx512f avx512bw\n")
    assert default_dtype(native) == "bfloat16"
    assert default_dtype(amx) == "bfloat16"
    assert default_dtype(emulated) == "float32"
    assert default_dtype(tmp_path / "missing") == "float32"
    # An explicit dtype always wins over the machine's default.
    assert EngineConfig(dtype="float32").dtype == "float32"
    assert EngineConfig().dtype == default_dtype()
