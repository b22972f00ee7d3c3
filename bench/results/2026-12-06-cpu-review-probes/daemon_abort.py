"""in_daemon_thread's work still in torch's C++ code when the process ends normally (as the engine process does
after its STOP_SIGNAL): the interpreter's finalization ends the daemon thread under C++ frames."""

import subprocess
import sys

child = r"""
import asyncio, time, torch
from app.ops.daemon_thread import in_daemon_thread
def factory():
    a = torch.randn(256, 256)
    end = time.monotonic() + 30
    while time.monotonic() < end:
        a = torch.tanh(a @ a)
async def main():
    task = asyncio.create_task(in_daemon_thread(factory, name="prepare-slow"))
    await asyncio.sleep(1)
    task.cancel()   # ModelControl.stop() cancels the load
    await asyncio.gather(task, return_exceptions=True)
asyncio.run(main())
print("main returned; interpreter exits", flush=True)
"""
for _i in range(3):
    done = subprocess.run(
        [sys.executable, "-c", child], capture_output=True, text=True, cwd=__import__("os").environ["ROOT"], timeout=120
    )
    print("returncode", done.returncode, "|", done.stdout.strip(), "|", done.stderr.strip()[-200:])
