"""The course's starting point: the PyTorch tutorial's MNIST code, kept as a teaching artifact.

The course was seeded with this code, hence `SeedNet` and `seed_train` ("seed": the starting code,
not random seeding, which is `course_lib.env.seed_everything`). It is the "before" picture that
notebook 01 runs, measures and then fixes, kept as the seed wrote it (the classic PyTorch tutorial
loop), with only what the course needs added around it: a `root` for the data, an optional training
subset, and a returned History so the three checks (no crash, loss falls, validation accuracy
rises) can be asserted. `seed_train` stays one long function on purpose: notebook 01 displays it
whole as the tutorial loop the course starts from.
What is wrong with it:

1. `F.log_softmax(x)` without `dim`: PyTorch guesses the dimension (and warns). For the 2-D
   [N, 10] output here it guesses right (dim=1); for other shapes it silently guesses wrong.
2. `nn.CrossEntropyLoss` is fed log-probabilities, but it applies log_softmax itself. Because
   log_softmax is idempotent the loss is the same number, yet the work is done twice and the
   model's output no longer means "logits" (`course_lib.models.Net` drops the extra call).
3. Batch size 4 through a DataLoader with per-sample ToTensor/Normalize: almost all the time
   goes into Python per-batch overhead, not arithmetic (see `python -m course_lib.bench cpu-mnist`).
4. SGD at lr 0.001 was tuned for batch 4; make the batch bigger and keep the lr, and the model
   takes fewer steps of the same size and learns less per epoch.

DataLoader workers pickle only the torchvision dataset (nothing from `__main__`), so this runs
from a notebook under fork (Linux) and spawn (macOS, Windows) alike.
"""
from __future__ import annotations

import time

import torch
import torch.nn as nn
import torch.nn.functional as F
import torch.optim as optim

from .data import mnist_dataset
from .loop import History
from .validate import positive_int


class SeedNet(nn.Module):
    """The seed's model, layer for layer `course_lib.models.Net`, plus the old final log_softmax.

    [N, 1, 28, 28] -> log-probabilities [N, 10]; same parameter names, so state_dicts swap.
    """

    def __init__(self):
        super(SeedNet, self).__init__()
        self.conv1 = nn.Conv2d(1, 10, kernel_size=5)
        self.conv2 = nn.Conv2d(10, 20, kernel_size=5)
        self.conv2_drop = nn.Dropout2d()
        self.fc1 = nn.Linear(320, 50)
        self.fc2 = nn.Linear(50, 10)

    def forward(self, x):
        x = F.relu(F.max_pool2d(self.conv1(x), 2))
        x = F.relu(F.max_pool2d(self.conv2_drop(self.conv2(x)), 2))
        x = x.view(-1, 320)
        x = F.relu(self.fc1(x))
        x = F.dropout(x, training=self.training)
        x = self.fc2(x)
        return F.log_softmax(x)  # no dim: the seed's code, on purpose (notebook 01, part 2)


def seed_train(root=None, epochs=2, batch_size=4, lr=0.001, momentum=0.9, num_workers=2,
               train_subset=None, log_every=2000, test_batch_size=1000, log=print, test_subset=None) -> History:
    """Train a fresh SeedNet the seed's way; evaluate on the test split after every epoch.

    root: MNIST folder (None: `data.data_root()`). train_subset: use the first N training images;
    test_subset: evaluate on the first N test images (None: all of them, as the seed does; reading them through
    PIL image by image costs more than training on a small subset). log_every: print the running loss every
    that many mini-batches (as the tutorial does). Returns a History (per-epoch train loss, test loss and accuracy, images/s;
    `.model` holds the trained SeedNet). images/s counts the training loop only, data loading
    included, evaluation excluded.
    """
    positive_int("epochs", epochs)
    positive_int("log_every", log_every)
    positive_int("train_subset", train_subset, allow_none=True)
    positive_int("test_subset", test_subset, allow_none=True)
    trainset = mnist_dataset("train", root)
    if train_subset is not None:
        trainset = torch.utils.data.Subset(trainset, range(min(train_subset, len(trainset))))
    testset = mnist_dataset("test", root)
    if test_subset is not None:
        testset = torch.utils.data.Subset(testset, range(min(test_subset, len(testset))))
    trainloader = torch.utils.data.DataLoader(trainset, batch_size=batch_size, shuffle=True,
                                              num_workers=num_workers)
    testloader = torch.utils.data.DataLoader(testset, batch_size=test_batch_size, shuffle=False)

    net = SeedNet()
    criterion = nn.CrossEntropyLoss()
    optimizer = optim.SGD(net.parameters(), lr=lr, momentum=momentum)
    history = History()
    say = log or (lambda *a: None)

    for epoch in range(epochs):  # loop over the dataset multiple times
        net.train()
        running_loss, epoch_loss, seen = 0.0, 0.0, 0
        t0 = time.perf_counter()
        for i, data in enumerate(trainloader, 0):
            # get the inputs; data is a list of [inputs, labels]
            inputs, labels = data

            # zero the parameter gradients
            optimizer.zero_grad()

            # forward + backward + optimize
            outputs = net(inputs)
            loss = criterion(outputs, labels)
            loss.backward()
            optimizer.step()

            # print statistics
            running_loss += loss.item()
            epoch_loss += loss.item() * labels.size(0)
            seen += labels.size(0)
            history.step_loss.append(loss.item())
            if i % log_every == log_every - 1:
                say('[%d, %5d] loss: %.3f' % (epoch + 1, i + 1, running_loss / log_every))
                running_loss = 0.0
        seconds = time.perf_counter() - t0

        correct, total, test_loss = 0, 0, 0.0
        net.eval()
        with torch.no_grad():
            for images, labels in testloader:
                outputs = net(images)
                test_loss += criterion(outputs, labels).item() * labels.size(0)
                _, predicted = torch.max(outputs.data, 1)
                total += labels.size(0)
                correct += (predicted == labels).sum().item()

        history.train_loss.append(epoch_loss / seen)
        history.epoch_seconds.append(seconds)
        history.images_per_second.append(seen / seconds)
        history.val_loss.append(test_loss / total)
        history.val_accuracy.append(correct / total)
        say('epoch %d: %.0f images/s, accuracy of the network on the %d test images: %.2f %%'
            % (epoch + 1, seen / seconds, total, 100 * correct / total))

    say('Finished Training')
    history.model = net
    return history
