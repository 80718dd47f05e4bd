import warnings

import pytest
import torch

from conftest import needs_mnist
from course_lib.models import Net, count_parameters
from course_lib.tutorial import SeedNet, seed_train


def test_seednet_matches_net_and_outputs_log_probabilities():
    seed_net = SeedNet()
    assert count_parameters(seed_net) == count_parameters(Net()) == 21_840
    net = Net()
    net.load_state_dict(seed_net.state_dict())  # same layers, same names
    seed_net.eval(), net.eval()
    x = torch.randn(3, 1, 28, 28)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = seed_net(x)
    assert any("Implicit dimension" in str(w.message) for w in caught)  # the seed's missing dim
    assert out.shape == (3, 10)
    torch.testing.assert_close(out, torch.log_softmax(net(x), dim=1))
    torch.testing.assert_close(out.exp().sum(1), torch.ones(3))


def test_seed_train_refuses_bad_arguments():
    with pytest.raises(ValueError, match="epochs"):
        seed_train(epochs=0)
    with pytest.raises(ValueError, match="log_every"):
        seed_train(log_every=0)
    with pytest.raises(ValueError, match="test_subset"):
        seed_train(test_subset=0)


@pytest.mark.slow
@needs_mnist
@pytest.mark.filterwarnings("ignore:Implicit dimension choice")
def test_seed_train_runs_on_a_tiny_subset_and_reports():
    lines = []
    torch.manual_seed(0)
    hist = seed_train(epochs=2, train_subset=200, num_workers=0, log_every=25, log=lines.append, test_subset=300)
    assert len(hist.train_loss) == len(hist.val_accuracy) == len(hist.images_per_second) == 2
    assert len(hist.step_loss) == 2 * 50
    assert all(0.0 <= a <= 1.0 for a in hist.val_accuracy)
    assert all(r > 0 for r in hist.images_per_second) and hist.train_seconds > 0
    assert hist.train_loss[-1] < hist.train_loss[0]  # loss falls even on 200 images
    assert any(line.startswith("[1,    25] loss:") for line in lines) and lines[-1] == "Finished Training"
    assert isinstance(hist.model, SeedNet)
    assert "on the 300 test images" in lines[-2]
