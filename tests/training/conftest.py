import pytest
import torch


@pytest.fixture(autouse=True)
def one_thread():
    # Tiny models: thread start-up and oversubscription on a shared CPU cost more than the maths.
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
