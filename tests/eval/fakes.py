"""Fake models with a planted phase pattern (they read the prompt, so no training is needed)."""

import numpy as np
import torch


class PlantedLookup(torch.nn.Module):
    """Answers a retrieval prompt right with probability pattern[t mod len(pattern)], t = the position of the
    first occurrence of the query's last token; a deterministic hash of the prompt plays the coin."""

    def __init__(self, vocab: int, pattern):
        super().__init__()
        self.vocab = vocab
        self.pattern = np.asarray(pattern, dtype=float)
        self.dummy = torch.nn.Parameter(torch.zeros(1))  # gives the module a device

    def forward(self, input_ids, **kw):
        B, T = input_ids.shape
        logits = torch.zeros(B, T, self.vocab)
        for b in range(B):
            ids = input_ids[b].tolist()
            q = ids[-1]
            t = ids.index(q)
            coin = (sum((i + 1) * x * 2654435761 for i, x in enumerate(ids)) % 10007) / 10007
            target = ids[t + 1] if coin < self.pattern[t % len(self.pattern)] else (ids[t + 1] + 1) % self.vocab
            logits[b, -1, target] = 10.0
        return logits


class PlantedFlip(torch.nn.Module):
    """Prefers token a when (sequence length - 1) mod 4 is in {2, 3}, else token b (the paper's Figure 1)."""

    def __init__(self, vocab: int, a: int, b: int):
        super().__init__()
        self.vocab, self.a, self.b = vocab, a, b
        self.dummy = torch.nn.Parameter(torch.zeros(1))

    def forward(self, input_ids, **kw):
        B, T = input_ids.shape
        logits = torch.zeros(B, T, self.vocab)
        win, lose = (self.a, self.b) if (T - 1) % 4 in (2, 3) else (self.b, self.a)
        logits[:, :, win], logits[:, :, lose] = 3.0, 2.0
        return logits
