import pytest

from schemas.config import ConfigError, StrataConfig, default_toml, env_overrides, load_config


def test_defaults_match_design():
    cfg = StrataConfig()
    assert (cfg.chunking.size, cfg.chunking.overlap) == (1200, 100)
    assert cfg.hierarchy.posterior_threshold == 0.1
    assert cfg.hierarchy.epsilon == 0.05
    assert cfg.embedding.model == "local"
    assert cfg.llm.model == ""  # offline by default


def test_file_then_env_then_overrides(tmp_path):
    path = tmp_path / "strata.toml"
    path.write_text("[chunking]\nsize = 500\noverlap = 50\n[dask]\nn_workers = 3\n")
    env = {"STRATA_CHUNKING__SIZE": "800", "STRATA_DASK__ADDRESS": "tcp://127.0.0.1:8786", "OTHER": "x"}
    cfg = load_config(path, overrides={"dask": {"n_workers": 1}}, environ=env)
    assert cfg.chunking.size == 800 and cfg.chunking.overlap == 50
    assert cfg.dask.address == "tcp://127.0.0.1:8786"
    assert cfg.dask.n_workers == 1


def test_unrelated_strata_variables_are_ignored_but_section_typos_are_not():
    assert env_overrides({"STRATA_REPO": "/src", "STRATA_SEED": "3"}) == {"seed": 3}
    with pytest.raises(ConfigError, match="chunkin"):
        load_config(environ={"STRATA_CHUNKIN__SIZE": "5"})


def test_env_values_are_parsed_as_json_when_possible():
    assert env_overrides({"STRATA_HIERARCHY__META_ENTITIES": '["a","b"]', "STRATA_SEED": "7"}) == {
        "hierarchy": {"meta_entities": ["a", "b"]},
        "seed": 7,
    }


@pytest.mark.parametrize(
    "toml, needle",
    [
        ("[chunking]\nsize = 100\noverlap = 100\n", "overlap (100) must be smaller than size (100)"),
        ("[chunking]\nsize = -1\n", "chunking.size"),
        ("[chunkin]\nsize = 10\n", "chunkin"),
        ("[extract]\nmethod = 'magic'\n", "extract.method"),
        ("not = [valid", "not valid TOML"),
        # a prompt override the stage could not fill
        ("[llm.prompts.reprot]\nsystem = 'x'\n", "no prompt named 'reprot' (known: extract_entities"),
        ("[llm.prompts.report]\nuser = 'Write a report.'\n", "report.user must use $material"),
        ("[llm.prompts.answer]\nuser = '$context $question $mode'\n", "answer.user uses $mode, not a field of it"),
        ("[llm.prompts.answer]\nuser = '$context $question costs $5'\n", "'$' that starts no field"),
        ("[llm.prompts.extract_gleaning]\nsystem = 'x'\n", "has no system message to replace"),
    ],
)
def test_bad_config_has_a_clear_message(tmp_path, toml, needle):
    path = tmp_path / "strata.toml"
    path.write_text(toml)
    with pytest.raises(ConfigError) as err:
        load_config(path, environ={})
    assert needle in str(err.value)


def test_missing_file():
    with pytest.raises(ConfigError, match="not found"):
        load_config("/nonexistent/strata.toml", environ={})


def test_default_toml_round_trips(tmp_path):
    path = tmp_path / "strata.toml"
    path.write_text(default_toml())
    assert load_config(path, environ={}) == StrataConfig()
    assert "# Tokens per chunk" in default_toml()


def test_a_prompt_override_replaces_its_message_and_keeps_the_other():
    from schemas.prompts import DEFAULT_PROMPTS, PromptSet

    cfg = load_config(overrides={"llm": {"prompts": {"answer": {"user": "Known:\n$context\nQ: $question (costs $$1)"}}}},
                      environ={})
    answer = PromptSet(cfg.llm.prompts)["answer"]
    assert answer.system == DEFAULT_PROMPTS["answer"].system
    assert answer.messages(context="Bob was a clerk.", question="Who was Bob?")[1] == {
        "role": "user", "content": "Known:\nBob was a clerk.\nQ: Who was Bob? (costs $1)"}
    assert PromptSet(cfg.llm.prompts)["report"] == DEFAULT_PROMPTS["report"]


def test_init_writes_every_prompt_commented_out_and_each_uncommented_is_the_default(tmp_path):
    from schemas.prompts import DEFAULT_PROMPTS, PromptSet

    text = default_toml()
    assert all(f"# [llm.prompts.{name}]" in text for name in DEFAULT_PROMPTS)
    # uncomment every prompt table: the texts read back are the defaults, byte for byte
    lines, out, on = text.split("\n"), [], False
    for line in lines:
        if line.startswith("# [llm.prompts."):
            on = True
            out.append(line[2:])
        elif on and (line.startswith("# ") or line == "#"):
            out.append(line[2:])
        else:
            on = False
            out.append(line)
    path = tmp_path / "strata.toml"
    path.write_text("\n".join(out))
    cfg = load_config(path, environ={})
    assert set(cfg.llm.prompts) == set(DEFAULT_PROMPTS)
    prompts = PromptSet(cfg.llm.prompts)
    assert all(prompts[name] == p for name, p in DEFAULT_PROMPTS.items())
