# clientamp.py lines 40-42, as written there, on a small model: the proximal term's gradient
import torch
torch.manual_seed(0)
model, client_u = torch.nn.Linear(4, 3), torch.nn.Linear(4, 3)
x, y = torch.randn(5, 4), torch.randint(0, 3, (5,))
loss = torch.nn.functional.cross_entropy(model(x), y)
gm = torch.cat([p.data.view(-1) for p in model.parameters()], dim=0)
pm = torch.cat([p.data.view(-1) for p in client_u.parameters()], dim=0)
term = 0.5 * 1.0 / 1.0 * torch.norm(gm - pm, p=2)
(loss + term).backward()
with_term = [p.grad.clone() for p in model.parameters()]
model.zero_grad(); torch.nn.functional.cross_entropy(model(x), y).backward()
print("term", round(term.item(), 3), "requires_grad", term.requires_grad,
      "gradient identical to cross-entropy alone:", all(torch.equal(a, p.grad) for a, p in zip(with_term, model.parameters())))
