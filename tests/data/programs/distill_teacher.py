"""Knowledge distillation: a frozen teacher (built, never trained, called under no_grad in
the step) and a student trained on a mix of the teacher's softened outputs (KL divergence at
temperature T) and the labels."""

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset


class Teacher(nn.Module):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(10, 32), nn.ReLU(), nn.Linear(32, 4))

    def forward(self, x):
        return self.net(x)


class Student(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(10, 8)
        self.fc2 = nn.Linear(8, 4)

    def forward(self, x):
        return self.fc2(F.relu(self.fc1(x)))


def distillation_loss(student_logits, teacher_logits, labels, T=2.0, alpha=0.5):
    soft = F.kl_div(F.log_softmax(student_logits / T, dim=1),
                    F.softmax(teacher_logits / T, dim=1), reduction="batchmean") * (T * T)
    hard = F.cross_entropy(student_logits, labels)
    return alpha * soft + (1 - alpha) * hard


def train_student(teacher, student, loader, epochs=2, lr=1e-2, device="cpu"):
    teacher.eval()
    for p in teacher.parameters():
        p.requires_grad_(False)
    student.train()
    optimizer = torch.optim.Adam(student.parameters(), lr=lr)
    for epoch in range(epochs):
        running = 0.0
        for inputs, labels in loader:
            inputs, labels = inputs.to(device), labels.to(device)
            optimizer.zero_grad()
            with torch.no_grad():
                teacher_logits = teacher(inputs)
            student_logits = student(inputs)
            loss = distillation_loss(student_logits, teacher_logits, labels)
            loss.backward()
            optimizer.step()
            running += loss.item()
        print(f"epoch {epoch} loss {running / len(loader):.4f}")


def main():
    torch.manual_seed(0)
    x = torch.randn(64, 10)
    y = torch.randint(0, 4, (64,))
    loader = DataLoader(TensorDataset(x, y), batch_size=16, shuffle=True)
    teacher = Teacher()
    student = Student()
    train_student(teacher, student, loader)
    with torch.no_grad():
        acc = (student(x).argmax(1) == y).float().mean().item()
    print(f"student acc {acc:.3f}")


if __name__ == "__main__":
    main()
