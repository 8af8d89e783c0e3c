"""The monitor's pieces on their own: spike scores, heatmap pictures, the ProRes scheduler."""

import io
import math
import time

import numpy
import pytest
import torch
from PIL import Image

from prores.errors import UsageError
from prores.model.prores import ProRes, ProResScheduler
from prores.monitor.heatmaps import Painter, heatmap, png, series_matrix
from prores.monitor.spikes import MIN_HISTORY, SpikeScore


def test_a_spike_is_more_than_sigma_deviations_above_the_windows_mean():
    score = SpikeScore(sigma=2.0, window=4)
    values = [1.0, 3.0, 1.0, 3.0]  # mean 2, std 1: above 4 is a spike
    values += [4.0, 3.9]  # 4.0 is not above 2 + 2·1; then the window is [3, 1, 3, 4]: limit 2.75 + 2·1.090
    values += [5.0]  # window [1, 3, 4, 3.9]: limit 2.975 + 2·1.205 = 5.385: no
    values += [9.0]  # window [3, 4, 3.9, 5]: limit 3.975 + 2·0.708 = 5.392: a spike
    got = [score.add(step, v) for step, v in enumerate(values)]
    assert got == [False] * 7 + [True]  # the first 4 are unscored: the window is not yet full
    assert score.spikes == [7] and score.score == pytest.approx(1 / 8)


def test_unscored_and_non_finite_steps_count_in_the_denominator_only():
    score = SpikeScore(sigma=7.0, window=1000)
    for step in range(MIN_HISTORY):
        assert not score.add(step, 1.0 + 0.01 * (step % 2))
    assert not score.add(MIN_HISTORY, math.nan) and not score.add(MIN_HISTORY + 1, math.inf)
    assert score.add(MIN_HISTORY + 2, 2.0)  # std 0.005 over the finite values
    assert len(score.values) == MIN_HISTORY + 1 and score.score == pytest.approx(1 / (MIN_HISTORY + 3))


def test_spike_state_round_trips():
    a = SpikeScore(7.0, 5)
    for step, v in enumerate([1.0, 2.0, 1.5, 1.2, 9.0, 1.1, 1.3]):
        a.add(step, v)
    b = SpikeScore(7.0, 5)
    b.load_state_dict(a.state_dict())
    assert [b.add(9, 1.2), b.add(10, 50.0)] == [a.add(9, 1.2), a.add(10, 50.0)]
    assert b.state_dict() == a.state_dict()


def decode(png_bytes: bytes) -> numpy.ndarray:
    picture = Image.open(io.BytesIO(png_bytes))
    assert picture.format == "PNG"
    return numpy.asarray(picture.convert("RGB"))


def test_a_heatmap_is_a_png_of_the_data():
    rng = numpy.random.default_rng(0)
    values = numpy.exp(rng.normal(size=(12, 30)))
    kwargs = dict(title="t", xlabel="step", label="act_rms")
    first = decode(png(heatmap(values, list(range(0, 300, 10)), **kwargs)))
    assert first.shape == (450, 700, 3)
    again = decode(png(heatmap(values, list(range(0, 300, 10)), **kwargs)))
    changed = values.copy()
    changed[5, 10:] *= 100  # one layer grows
    other = decode(png(heatmap(changed, list(range(0, 300, 10)), **kwargs)))
    assert numpy.array_equal(first, again) and not numpy.array_equal(first, other)


def test_a_heatmap_starts_at_the_first_step_and_a_column_lasts_until_the_next():
    fig = heatmap(numpy.ones((2, 3)), [0, 10, 20], title="t", xlabel="step", label="alpha")
    mesh = fig.axes[0].collections[0]
    assert list(mesh.get_coordinates()[0, :, 0]) == [0, 10, 20, 30]
    assert fig.axes[0].get_xlim() == (0, 30)


def test_zeros_and_gaps_are_grey_on_a_log_scale():
    values = numpy.ones((3, 4))
    values[0, 0] = 0.0
    values[2, 3] = numpy.nan
    grey = (numpy.array([204, 204, 204]))  # matplotlib "0.8"
    pixels = decode(png(heatmap(values, [0, 1, 2, 3], title="t", xlabel="step", label="alpha")))
    assert (numpy.abs(pixels.astype(int) - grey).sum(-1) == 0).sum() > 1000


class TimedWriter:
    def __init__(self):
        self.images = []

    def image(self, tag, rgb, step):
        self.images.append((tag, step, rgb.shape, time.perf_counter()))


def test_the_painter_rests_so_drawing_takes_its_share_and_the_end_draws_what_waits():
    """After a picture that took d seconds the painter waits d·(1/SHARE − 1) before the next; close() draws the
    newest waiting picture of each tag at once, the older one of a tag never."""
    writer, took = TimedWriter(), []

    def draw(seconds):
        def fig():
            start = time.perf_counter()
            time.sleep(seconds)  # the picture's cost, as a real one's would be
            took.append(time.perf_counter() - start)
            return heatmap(numpy.ones((2, 2)), [0, 1], title="", xlabel="step", label="")
        return fig

    painter = Painter(writer)
    painter.SHARE = 0.5  # rest as long as the picture took
    painter.submit("a", draw(0.2), 1)
    while not writer.images:
        time.sleep(0.01)
    painter.submit("b", draw(0.0), 2)
    while len(writer.images) < 2:
        time.sleep(0.01)
    # b started no sooner than a's drawing time after a was written (its own draw took ~0)
    assert writer.images[1][3] - writer.images[0][3] >= took[0] * (1 / 0.5 - 1)
    painter.submit("c", draw(0.05), 3)  # rests behind b: still waiting when ...
    painter.submit("a", draw(0.0), 4)
    painter.submit("a", draw(0.0), 5)  # ... a newer "a" replaces step 4's
    painter.close()
    assert [(tag, step) for tag, step, *_ in writer.images] == [("a", 1), ("b", 2), ("c", 3), ("a", 5)]



def test_a_pause_is_no_rest():
    """monitor_overhead.py pauses the painter through its off blocks: the rest after a picture counts only the time
    it was not paused, so the on blocks pay the share a run pays, not the off blocks' share too."""
    writer, took = TimedWriter(), []

    def draw():
        start = time.perf_counter()
        time.sleep(0.1)
        took.append(time.perf_counter() - start)
        return heatmap(numpy.ones((2, 2)), [0, 1], title="", xlabel="step", label="")

    painter = Painter(writer)
    painter.SHARE = 0.5
    painter.submit("a", draw, 1)
    while not writer.images:
        time.sleep(0.01)
    painter.pause()
    paused = time.perf_counter()
    time.sleep(0.3)
    paused = time.perf_counter() - paused
    painter.submit("b", lambda: heatmap(numpy.ones((2, 2)), [0, 1], title="", xlabel="step", label=""), 2)
    painter.resume()
    while len(writer.images) < 2:  # not close(): the end draws at once
        time.sleep(0.01)
    painter.close()
    assert writer.images[1][3] - writer.images[0][3] >= took[0] * (1 / 0.5 - 1) + paused

def test_series_become_a_layer_by_step_matrix():
    matrix, steps = series_matrix({10: {1: 0.5, 3: 2.0}, 0: {2: 1.0}}, num_layers=3)
    assert steps == [0, 10]
    assert numpy.array_equal(numpy.isnan(matrix), [[True, False], [False, True], [True, False]])
    assert matrix[0, 1] == 0.5 and matrix[1, 0] == 1.0 and matrix[2, 1] == 2.0


class FakeBlock:
    def __init__(self, layer, prores):
        self.layer_number, self.prores, self.alpha = layer, prores, None

    def set_step(self, step):
        self.alpha = None if self.prores.saturated(step) else torch.tensor(self.prores.alpha(self.layer_number, step))


def test_the_scheduler_sets_alpha_and_reads_back_what_the_blocks_apply():
    prores = ProRes("linear", 10, 4)
    blocks = {l: FakeBlock(l, prores) for l in (3, 4)}  # one pipeline stage's blocks
    scheduler = ProResScheduler(prores, blocks)
    scheduler.step(15)
    assert scheduler.applied() == pytest.approx({3: 0.5, 4: 15 / 40})
    blocks[4].alpha = torch.tensor(0.25)  # what the block applies, not the formula, is read back
    assert scheduler.applied()[4] == 0.25
    scheduler.step(40)
    assert scheduler.applied() == {3: 1.0, 4: 1.0}  # saturated: the blocks drop the multiply


def test_a_checkpoint_of_another_schedule_is_refused():
    scheduler = ProResScheduler(ProRes("linear", 10, 4), {})
    scheduler.load_state_dict({"schedule": "linear", "T": 10, "num_layers": 4})
    with pytest.raises(UsageError, match=r"trained with ProRes \{'schedule': 'linear', 'T': 20, 'num_layers': 4\}"):
        scheduler.load_state_dict({"schedule": "linear", "T": 20, "num_layers": 4})
