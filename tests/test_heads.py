"""Hand-written action distributions against torch.distributions."""

import torch
from torch.distributions import Categorical, Independent, Normal

from rlcli.actors.heads import CategoricalHead, GaussianHead
from rlcli.actors.normalizer import RunningNorm


def test_categorical_log_prob_and_entropy_match_torch():
    torch.manual_seed(0)
    head = CategoricalHead(6, 4)
    feats = torch.randn(32, 6)
    log_probs = head(feats)
    ref = Categorical(logits=head.logits(feats))
    actions = ref.sample()
    torch.testing.assert_close(head.log_prob(log_probs, actions), ref.log_prob(actions))
    torch.testing.assert_close(head.entropy(log_probs), ref.entropy())
    assert torch.equal(head.sample(log_probs, deterministic=True), ref.probs.argmax(-1))


def test_categorical_sampling_frequencies_follow_the_probabilities():
    torch.manual_seed(1)
    log_probs = torch.log(torch.tensor([[0.1, 0.6, 0.3]])).expand(200_000, 3)
    counts = torch.bincount(CategoricalHead.sample(log_probs, deterministic=False), minlength=3).float()
    torch.testing.assert_close(counts / counts.sum(), torch.tensor([0.1, 0.6, 0.3]), atol=0.005, rtol=0)


def test_categorical_samples_on_draws_taken_beforehand_are_its_own_and_batch_bit_for_bit():
    """A population draws each member's uniforms from the member's own stream, then samples all members at once."""
    log_probs = torch.log_softmax(torch.randn(4, 8, 3, generator=torch.Generator().manual_seed(2)), -1)
    torch.manual_seed(5)
    own = [CategoricalHead.sample(member, deterministic=False) for member in log_probs]
    torch.manual_seed(5)
    uniforms = torch.stack([CategoricalHead.draw(member) for member in log_probs])
    assert torch.equal(CategoricalHead.sample(log_probs, False, uniforms), torch.stack(own))


def test_gaussian_log_prob_and_entropy_match_torch():
    torch.manual_seed(0)
    head = GaussianHead(5, 3, log_std_init=-0.3)
    with torch.no_grad():
        head.log_std.copy_(torch.tensor([-0.5, 0.0, 0.7]))
    feats = torch.randn(16, 5)
    mean = head(feats)
    ref = Independent(Normal(mean, head.log_std.exp()), 1)
    actions = ref.sample()
    torch.testing.assert_close(head.log_prob(mean, actions), ref.log_prob(actions))
    torch.testing.assert_close(head.entropy(mean), ref.entropy())
    assert torch.equal(head.sample(mean, deterministic=True), mean)


def test_running_norm_matches_numpy_moments_and_freezes_when_not_updated():
    torch.manual_seed(0)
    norm = RunningNorm((3,), clip=100.0)
    data = torch.randn(1000, 3) * torch.tensor([1.0, 5.0, 0.1]) + torch.tensor([2.0, -3.0, 0.5])
    for chunk in data.split(37):
        norm.update(chunk)
    torch.testing.assert_close(norm.mean.float(), data.mean(0), atol=1e-4, rtol=0)
    torch.testing.assert_close(norm.var.float(), data.var(0, unbiased=False), rtol=1e-3, atol=1e-4)
    out = norm(data)
    torch.testing.assert_close(out.mean(0), torch.zeros(3), atol=1e-3, rtol=0)
    before = norm.state_dict()["mean"].clone()
    norm(data * 7)  # applying never changes the statistics
    assert torch.equal(norm.mean, before)
    assert RunningNorm((3,), enabled=False)(data * 7).equal(data * 7)
