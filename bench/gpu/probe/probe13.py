import warnings, time, io, contextlib, torch
from mambalearn import model as M, device
dev = device.setup(seed=0)
RUN = dict(steps=60, batch=64, lr=3e-3, seed=0, task=dict(n_data=6, n_blank=58, n_symbols=8))
torch.manual_seed(0)
m = M.MambaLM(M.MambaConfig(vocab_size=10, n_layers=2, d_model=64, d_state=16, backend="chunked")).to(dev)
buf = io.StringIO()
with warnings.catch_warnings(record=True) as w, contextlib.redirect_stdout(buf), contextlib.redirect_stderr(buf):
    warnings.simplefilter("always")
    t = time.time(); M.train(m, log_every=10, **RUN); dt = time.time() - t
print("train 60 steps", round(dt, 1), "s; warnings", len(w), set(str(x.message)[:120] for x in w))
print("printed chars", len(buf.getvalue()), repr(buf.getvalue()[:600]))
