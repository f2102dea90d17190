"""The workshop's models: shapes on every dataset's images, causality and learning of the LM."""
import pytest
import torch
import torch.nn.functional as F

from source_code import data, models


@pytest.fixture(autouse=True)
def one_thread():
    """One intra-op thread: on a busy 2-core machine two threads spin against each other
    (measured: 40 transformer steps 2.3 s with one thread, 24 s with two)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.mark.parametrize("channels,size", [(1, 8), (1, 28), (3, 32)])  # digits, MNIST, CIFAR-10
def test_small_cnn_takes_every_dataset_image_size(channels, size):
    torch.manual_seed(0)
    model = models.SmallCNN(in_channels=channels)
    out = model(torch.randn(5, channels, size, size))
    assert out.shape == (5, 10)
    # same number of parameters whatever the image size (adaptive pooling before the classifier)
    assert models.count_parameters(model) == models.count_parameters(models.SmallCNN(channels))


def test_resnet18_cifar_keeps_spatial_resolution_for_32x32():
    model = models.build_model("resnet18").eval()
    assert model.conv1.stride == (1, 1)  # the ImageNet stem would shrink 32x32 to 8x8 at once
    with torch.no_grad():
        assert model(torch.randn(2, 3, 32, 32)).shape == (2, 10)
    assert 11_000_000 < models.count_parameters(model) < 11_300_000


def test_build_model_rejects_unknown_names():
    with pytest.raises(SystemExit, match="choose one of smallcnn, resnet18, transformer"):
        models.build_model("vit")


def test_transformer_shapes_and_causality():
    torch.manual_seed(0)
    model = models.TransformerLM(vocab_size=20, dim=32, n_layers=2, n_heads=4, max_len=16).eval()
    tokens = torch.randint(0, 20, (3, 12))
    with torch.no_grad():
        logits = model(tokens)
        assert logits.shape == (3, 12, 20)
        changed = tokens.clone()
        changed[:, 7] = (changed[:, 7] + 1) % 20  # change a "future" token
        logits2 = model(changed)
    # positions before 7 cannot see the change; position 7 and later do
    assert torch.equal(logits[:, :7], logits2[:, :7])
    assert (logits[:, 7:] - logits2[:, 7:]).abs().amax() > 1e-4


def test_transformer_names_the_fix_for_too_long_sequences():
    model = models.TransformerLM(max_len=8)
    with pytest.raises(ValueError, match=r"sequence length 9 exceeds max_len 8; build TransformerLM\(max_len=9\)"):
        model(torch.zeros(1, 9, dtype=torch.long))


def test_transformer_learns_the_sort_task_a_little():
    torch.manual_seed(0)
    x, y = data.load("sort", "train").tensors
    model = models.TransformerLM(vocab_size=17, dim=64, n_layers=2, n_heads=4, max_len=32)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)

    def loss_on(batch):
        logits = model(x[batch])
        return F.cross_entropy(logits.flatten(0, 1), y[batch].flatten(), ignore_index=-100)

    held = torch.arange(1024, 1280)  # fixed batch, never trained on
    with torch.no_grad():
        before = loss_on(held).item()
    for step in range(40):
        loss = loss_on(torch.arange(64 * step % 1024, 64 * step % 1024 + 64))
        opt.zero_grad()
        loss.backward()
        opt.step()
    with torch.no_grad():
        after = loss_on(held).item()
    # log(17) = 2.83 at the start; learning "answer tokens are sorted" alone brings it well below
    print(f"sort task held-out loss {before:.3f} -> {after:.3f}")
    assert before > 2.7 and after < 0.8 * before, (before, after)
