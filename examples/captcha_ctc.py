"""Captcha text recognition with CTC: a text field stored with its vocabulary, batched for
``ctc_loss`` as it comes.

    python examples/captcha_ctc.py                        # tiny generated captchas, on the CPU
    python examples/captcha_ctc.py --data captcha.lmdb --vocab 0123456789abcdef... --epochs 100

The text is a text field converted with a vocabulary: character ``c`` is stored as
``vocab.index(c) + 1``, and the loader pads each batch's codes with 0, which is CTC's blank, so
``batch["text"]`` (N × longest) and ``batch["text_lengths"]`` (N) go to
``torch.nn.functional.ctc_loss`` unchanged. The model reads the image column by column (a few
conv layers, the height pooled away) and emits one distribution over blank + vocabulary per
column; greedy decoding collapses repeats and drops blanks. At the end: the share of validation
captchas read exactly, the character error, and the data-wait share. A few epochs on the tiny
set teach it little; the point is the pipeline.

Your own data: a CSV/JSONL manifest ``path,text``, converted with
``feedpipe convert captcha.csv --text-column text --vocab 0123456789abcdefghjkmnpqrstuvwxyz
--to lmdb -o captcha.lmdb --val-fraction 0.1``, then ``--data captcha.lmdb --vocab ...``.
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path
from typing import Any

import torch

import feedpipe
from converters import LabelColumns


class Reader(torch.nn.Module):
    """Conv layers down to one row, then a linear layer per column: T × N × (blank + vocab)."""

    def __init__(self, vocab: int) -> None:
        super().__init__()
        self.conv = torch.nn.Sequential(
            torch.nn.Conv2d(3, 32, 3, padding=1), torch.nn.ReLU(), torch.nn.MaxPool2d(2),
            torch.nn.Conv2d(32, 64, 3, padding=1), torch.nn.ReLU(), torch.nn.MaxPool2d((2, 1)),
            torch.nn.Conv2d(64, 64, 3, padding=1), torch.nn.ReLU())
        self.out = torch.nn.Linear(64, vocab + 1)

    def forward(self, image: torch.Tensor) -> torch.Tensor:
        features = self.conv(image).mean(2)                # N × C × W/2: height pooled away
        return self.out(features.permute(2, 0, 1)).log_softmax(2)  # T × N × classes


def decode(log_probs: torch.Tensor, vocab: str) -> list[str]:
    """Greedy CTC decoding: the best class per column, repeats collapsed, blanks dropped."""
    best = log_probs.argmax(2).T.tolist()  # N × T
    out = []
    for seq in best:
        chars, prev = [], 0
        for k in seq:
            if k != prev and k != 0:
                chars.append(vocab[k - 1])
            prev = k
        out.append("".join(chars))
    return out


def texts(batch: dict[str, torch.Tensor], vocab: str) -> list[str]:
    """The batch's true texts, from the padded codes and their lengths."""
    return ["".join(vocab[c - 1] for c in row[:n].tolist())
            for row, n in zip(batch["text"], batch["text_lengths"].tolist(), strict=True)]


def edit_distance(a: str, b: str) -> int:
    """Levenshtein distance (the character errors between a and b)."""
    row = list(range(len(b) + 1))
    for i, ca in enumerate(a, 1):
        prev, row[0] = row[0], i
        for j, cb in enumerate(b, 1):
            prev, row[j] = row[j], min(row[j] + 1, row[j - 1] + 1, prev + (ca != cb))
    return row[-1]


def prepare(args: argparse.Namespace) -> Path:
    """The packed dataset (train/ and val/): ``--data``, or generated captchas converted with
    their text column and vocabulary."""
    if args.data:
        return Path(args.data)
    packed = args.work / "captcha.lmdb"
    if packed.exists():
        print(f"using {packed}, made by an earlier run (remove it to generate anew)")
    else:
        import tiny_data

        manifest = tiny_data.captchas(args.work / "captcha", n=args.samples)
        feedpipe.convert(manifest, packed, to="lmdb", val_fraction=0.2, seed=0,
                         columns=LabelColumns(text="text", vocab=args.vocab))
    return packed


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--data", help="a packed dataset folder (train/, val/) with a 'text' field")
    p.add_argument("--vocab", default="0123456789abcdefghjkmnpqrstuvwxyz",
                   help="the vocabulary the text was converted with")
    p.add_argument("--work", type=Path, default=Path(tempfile.gettempdir()) / "feedpipe-examples"
                   / "captcha", help="where the generated data goes (without --data)")
    p.add_argument("--samples", type=int, default=192, help="generated captchas (without --data)")
    p.add_argument("--epochs", type=int, default=4)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--height", type=int, default=32)
    p.add_argument("--width", type=int, default=96)
    p.add_argument("--workers", default="auto", help="loader processes, or auto")
    args = p.parse_args()
    data = prepare(args)
    workers = args.workers if args.workers == "auto" else int(args.workers)
    kw: dict[str, Any] = dict(size=(args.height, args.width), crop="resize",
                              fields=["image", "text"], num_workers=workers)
    train = feedpipe.make_loader(data / "train", args.batch_size, **kw)
    val = feedpipe.make_loader(data / "val", args.batch_size, shuffle=False, **kw)
    model = Reader(len(args.vocab))
    optimizer = torch.optim.Adam(model.parameters(), lr=2e-3)
    meter = feedpipe.StallMeter()
    for epoch in range(args.epochs):
        train.set_epoch(epoch)
        for batch in meter.wrap(train):
            log_probs = model(batch["image"])
            columns = torch.full((log_probs.shape[1],), log_probs.shape[0], dtype=torch.long)
            loss = torch.nn.functional.ctc_loss(log_probs, batch["text"], columns,
                                                batch["text_lengths"], zero_infinity=True)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        exact = errors = chars = 0
        with torch.no_grad():
            for batch in val:
                for got, want in zip(decode(model(batch["image"]), args.vocab),
                                     texts(batch, args.vocab), strict=True):
                    exact += got == want
                    errors, chars = errors + edit_distance(got, want), chars + len(want)
        print(f"epoch {epoch}: CTC loss {loss.item():.2f}; validation: {exact} read exactly, "
              f"character error {errors / chars:.0%}")
    print(meter.summary())


if __name__ == "__main__":
    main()
