import time, torch, ladle.torch as lt
B,T,H,D=8,4096,16,128
q=torch.randn(B,T,H,D,device="cuda",dtype=torch.bfloat16)
k=torch.randn(B,T,H,D,device="cuda",dtype=torch.bfloat16)
v=torch.randn(B,T,H,D,device="cuda",dtype=torch.bfloat16)
f=lambda: lt.attention(q,k,v,causal=True,scale=D**-0.5)
for _ in range(5): f()
torch.cuda.synchronize()
for heat in (0, 5):
    t0=time.time()
    while time.time()-t0<heat: f(); torch.cuda.synchronize()
    s,e=torch.cuda.Event(enable_timing=True),torch.cuda.Event(enable_timing=True)
    c0=time.perf_counter(); s.record()
    for _ in range(10): f()
    c1=time.perf_counter(); e.record(); e.synchronize()
    print(f"heat {heat}s: GPU {s.elapsed_time(e)/10:.3f} ms/call, CPU issue {1e3*(c1-c0)/10:.3f} ms/call")
