"""Ray actors on GPUs using accord.collective (gpu_frameworks_check.sh): two actors, one GPU
each, declare a group from the driver and run collectives and a message on CUDA tensors."""

import ray
import torch

ray.init(num_gpus=torch.cuda.device_count(), include_dashboard=False)


@ray.remote(num_gpus=1)
class Worker:
    def run(self, rank: int, world: int) -> list:
        import torch

        from accord import collective as col

        col.init_collective_group(world_size=world, rank=rank, group_name="gpu")
        t = torch.full((4,), float(rank + 1), device="cuda")
        col.allreduce(t, group_name="gpu")
        b = torch.full((2,), float(rank), device="cuda")
        col.broadcast(b, src_rank=world - 1, group_name="gpu")
        out = [torch.zeros(1, device="cuda") for _ in range(world)]
        col.allgather(out, torch.tensor([float(rank)], device="cuda"), group_name="gpu")
        m = torch.full((3,), float(rank), device="cuda")
        if rank == 0:
            col.send(m, 1, group_name="gpu")
        elif rank == 1:
            col.recv(m, 0, group_name="gpu")
        torch.cuda.synchronize()
        col.destroy_collective_group("gpu")
        return [t.tolist(), b.tolist(), [o.item() for o in out], m.tolist()]


world = 2
got = ray.get([w.run.remote(r, world) for r, w in enumerate([Worker.remote() for _ in range(world)])])
for rank, (t, b, out, m) in enumerate(got):
    assert t == [3.0] * 4, (rank, t)
    assert b == [float(world - 1)] * 2, (rank, b)
    assert out == [0.0, 1.0], (rank, out)
    assert m == [0.0] * 3, (rank, m)
print("GPU-RAY-OK", flush=True)
