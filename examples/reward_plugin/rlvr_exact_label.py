"""An rlvr reward plugin: the answer must be the row's label, one of the row's `choices`."""

from rlvr.rewards import RewardOutput, Sample, reward


def answer_of(completion: str) -> str:
    """The last <answer>...</answer> block's text, else the last non-empty line, lower-cased."""
    close = completion.rfind("</answer>")
    start = completion.rfind("<answer>", 0, max(close, 0))
    if 0 <= start < close:
        return completion[start + len("<answer>"):close].strip().lower()
    lines = [line.strip() for line in completion.splitlines() if line.strip()]
    return lines[-1].lower() if lines else ""


@reward(
    "exact_label",
    display_name="Exact label",
    description="1 when the answer is the row's label (ground_truth); also reports whether the answer is "
                "one of the row's choices.",
    columns=("choices",),
    instruction="Think inside <think></think>, then give only one of the choices inside <answer></answer>.",
)
def exact_label(sample: Sample) -> RewardOutput:
    answer = answer_of(sample.completion)
    choices = {str(c).strip().lower() for c in sample.columns["choices"]}
    return RewardOutput(
        score=float(answer == sample.ground_truth.strip().lower()),
        components={"valid_choice": float(answer in choices)},
        extracted_answer=answer,
    )
