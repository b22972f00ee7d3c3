"""Train FashionCNN on Fashion-MNIST on the CPU and write the weights the server ships.

    python -m models.train [--epochs 8] [--seed 0] [--out models/repository/fashion-cnn/fashion_cnn.pt]

Writes the state dict to --out and a record (test accuracy, epochs, seed, torch version,
training seconds, command) beside it as .json. Seeded end to end: the same command on the same
torch build gives the same weights.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from models.cnn import WEIGHTS_PATH, FashionCNN
from models.evaluate import evaluate, to_input
from models.fashion_mnist import load_split

BATCH_SIZE = 128
MAX_LR = 3e-3  # one-cycle peak for AdamW; warm up 20% of steps, then anneal to ~0
WEIGHT_DECAY = 1e-4


def train(epochs: int, seed: int) -> tuple[FashionCNN, float]:
    """Train from scratch; returns the model (eval mode) and the training wall time in seconds."""
    torch.manual_seed(seed)
    rng = np.random.default_rng(seed)  # drives the data order
    images, labels = load_split("train")  # uint8 (60000, 28, 28), int64 (60000,)
    test_images, test_labels = load_split("test")

    model = FashionCNN()
    optimizer = torch.optim.AdamW(model.parameters(), lr=MAX_LR, weight_decay=WEIGHT_DECAY)
    steps_per_epoch = -(-len(images) // BATCH_SIZE)
    schedule = torch.optim.lr_scheduler.OneCycleLR(
        optimizer, max_lr=MAX_LR, epochs=epochs, steps_per_epoch=steps_per_epoch, pct_start=0.2
    )

    start = time.perf_counter()
    for epoch in range(1, epochs + 1):
        model.train()
        order = rng.permutation(len(images))
        total_loss = 0.0
        for i in range(0, len(order), BATCH_SIZE):
            idx = order[i : i + BATCH_SIZE]
            x = to_input(images[idx])  # (B, 1, 28, 28) in [0, 1]
            y = torch.from_numpy(labels[idx])  # (B,)
            loss = F.cross_entropy(model(x), y)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            schedule.step()
            total_loss += loss.item() * len(idx)
        # Test accuracy is printed for information only; the last epoch is what ships.
        acc = evaluate(model, test_images, test_labels)
        elapsed = time.perf_counter() - start
        print(f"epoch {epoch}/{epochs}: loss {total_loss / len(images):.4f}, test {acc:.2f}%, {elapsed:.0f}s")
    return model.eval(), time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("--epochs", type=int, default=8)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=WEIGHTS_PATH, help="state dict path; .json beside it")
    args = parser.parse_args()
    if args.epochs < 1:
        parser.error("--epochs must be at least 1")

    model, seconds = train(args.epochs, args.seed)
    test_images, test_labels = load_split("test")
    accuracy = evaluate(model, test_images, test_labels)

    args.out.parent.mkdir(parents=True, exist_ok=True)
    torch.save(model.state_dict(), args.out)
    record = {
        "test_accuracy": round(accuracy, 2),
        "epochs": args.epochs,
        "seed": args.seed,
        "torch_version": torch.__version__,
        "training_seconds": round(seconds, 1),
        "command": " ".join(["python", "-m", "models.train", *sys.argv[1:]]),
    }
    args.out.with_suffix(".json").write_text(json.dumps(record, indent=2) + "\n")
    print(f"wrote {args.out} and {args.out.with_suffix('.json')}: test accuracy {accuracy:.2f}%")


if __name__ == "__main__":
    main()
