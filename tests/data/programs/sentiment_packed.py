"""A sentiment classifier as the NLP tutorials write it: token ids padded to the batch's
length with their lengths, an Embedding, pack_padded_sequence, a bidirectional LSTM, the last
states of both directions concatenated, a linear head; trained a few steps with Adam, the
loss printed per step."""

import torch
import torch.nn as nn
import torch.nn.functional as F


class RNN(nn.Module):
    def __init__(self, vocab_size, embedding_dim, hidden_dim, output_dim, n_layers, pad_index):
        super().__init__()
        self.embedding = nn.Embedding(vocab_size, embedding_dim, padding_idx=pad_index)
        self.lstm = nn.LSTM(embedding_dim, hidden_dim, n_layers, bidirectional=True,
                            batch_first=True)
        self.fc = nn.Linear(hidden_dim * 2, output_dim)

    def forward(self, ids, length):
        embedded = self.embedding(ids)
        packed_embedded = nn.utils.rnn.pack_padded_sequence(embedded, length.to("cpu"),
                                                            batch_first=True,
                                                            enforce_sorted=False)
        packed_output, (hidden, cell) = self.lstm(packed_embedded)
        output, output_length = nn.utils.rnn.pad_packed_sequence(packed_output)
        hidden = torch.cat([hidden[-1], hidden[-2]], dim=-1)
        return self.fc(hidden)


ids = torch.tensor([[3, 4, 1, 2, 4], [4, 2, 0, 0, 0], [1, 1, 3, 2, 0], [1, 0, 0, 0, 0]])
lengths = torch.tensor([5, 2, 4, 1])
labels = torch.tensor([1, 0, 1, 0])
torch.manual_seed(0)
model = RNN(5, 5, 3, 2, 2, pad_index=0)
optimizer = torch.optim.Adam(model.parameters(), lr=0.05)
for step in range(4):
    optimizer.zero_grad()
    prediction = model(ids, lengths)
    loss = F.cross_entropy(prediction, labels)
    loss.backward()
    optimizer.step()
    print(f"step {step} loss {loss.item():.6f}")
