"""Shared exploration and minibatch order (algos/exploration.py) against plain references."""

import torch

from rlcli.algos.exploration import epsilon_greedy, minibatches, uniform_box_actions


def test_epsilon_greedy_matches_a_plain_reference_draw_for_draw():
    greedy = torch.tensor([0, 1, 2, 3] * 250)
    torch.manual_seed(0)
    got = epsilon_greedy(greedy, n_actions=4, epsilon=0.3)
    torch.manual_seed(0)
    explore = torch.rand(greedy.shape) < 0.3
    random = torch.randint(0, 4, greedy.shape)
    assert torch.equal(got, torch.where(explore, random, greedy))
    changed = (got != greedy).float().mean().item()
    assert 0.15 < changed < 0.3  # 0.3 explore, of which 3/4 pick another action
    assert torch.equal(epsilon_greedy(greedy, 4, 0.0), greedy)


def test_uniform_box_actions_and_minibatches():
    torch.manual_seed(1)
    actions = uniform_box_actions(1000, 3)
    assert actions.shape == (1000, 3) and actions.min() >= -1 and actions.max() <= 1
    torch.manual_seed(2)
    chunks = list(minibatches(10, 4, "cpu"))
    assert [len(c) for c in chunks] == [4, 4, 2] and sorted(torch.cat(chunks).tolist()) == list(range(10))
    torch.manual_seed(2)
    assert torch.equal(torch.cat(chunks), torch.randperm(10))  # the same draw as a plain randperm
