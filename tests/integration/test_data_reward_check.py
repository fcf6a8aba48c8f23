"""Gold answers checked at load by the reward workers (`RewardRunner`: a worker subprocess)."""

import pytest

from dlc_jax.data.prompts import DataConfig, PromptPipeline
from dlc_jax.data.reward_runner import RewardRunner
from dlc_jax.data.rewards import RewardConfig
from dlc_jax.data.sources import DataError

datasets = pytest.importorskip("datasets")


class CharTok:
    """Independent tiny tokenizer: one id per character (ord); no chat template."""

    def encode(self, text, add_special_tokens=False):
        return [ord(c) for c in text]


def _gsm8k_rows(n):
    return {
        "question": [f"Tom has {i} apples and buys {i + 1} more. How many?" for i in range(n)],
        "answer": [f"{i} + {i + 1} = {2 * i + 1}\n#### {2 * i + 1}" for i in range(n)],
        "level": list(range(n)),
    }


def _pipe(cfg, batch=2, **kw):
    return PromptPipeline(cfg, CharTok(), batch, process_index=0, process_count=1, **kw)


def test_reward_runner_checks_gold_answers_at_load(tmp_path):
    d = tmp_path / "g"
    rows = _gsm8k_rows(6)
    rows["answer"][4] = "so the answer is\n#### five"
    datasets.Dataset.from_dict(rows).save_to_disk(str(d))
    cfg = DataConfig(source=f"hf:{d}", prompt_field="question", answer_format="gsm8k")
    with RewardRunner(RewardConfig(workers=1)) as runner:
        with pytest.raises(
            DataError, match=r"row 4: gold answer 'five' is not a number \(exact_match needs one\)"
        ):
            _pipe(cfg, 2, answer_check=runner.check_answers)
