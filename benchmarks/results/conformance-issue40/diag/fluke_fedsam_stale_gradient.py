import torch
from fluke.algorithms.fedsam import SAMOptimizer
torch.manual_seed(0)
m = torch.nn.Linear(3, 2)
opt = SAMOptimizer(m.parameters(), base_optimizer=torch.optim.SGD, rho=0.05, lr=0.1)
xs, ys = [torch.randn(4, 3) for _ in range(2)], [torch.randint(0, 2, (4,)) for _ in range(2)]
seen = []
def closure_for(x, y):
    def closure():
        loss = torch.nn.functional.cross_entropy(m(x), y); loss.backward(); seen.append(m.weight.grad.clone()); return loss
    return closure
opt.step(closure_for(xs[0], ys[0]))
left = m.weight.grad.clone()  # after step 1: the perturbed gradient of batch 0 is still there
w = m.weight.detach().clone(); b = m.bias.detach().clone()
m2 = torch.nn.Linear(3, 2); m2.weight.data, m2.bias.data = w.clone(), b.clone()
torch.nn.functional.cross_entropy(m2(xs[1]), ys[1]).backward()
opt.step(closure_for(xs[1], ys[1]))
print("grad left after step 1 is None:", left is None)
print("ascent gradient of step 2 == fresh gradient of batch 1:", torch.allclose(seen[2], m2.weight.grad))
print("ascent gradient of step 2 == fresh + left over:", torch.allclose(seen[2], m2.weight.grad + left))
