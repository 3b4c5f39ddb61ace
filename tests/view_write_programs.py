"""The programs of test_programs.py that write in place on intermediates, on inputs and through views of inputs,
each with a function making its arguments (VIEW_WRITE_PROGRAMS); test_programs.py runs them against eager."""

from __future__ import annotations

import torch


def r(*shape: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    return torch.randn(*shape).to(dtype)


# --- in-place on intermediates --------------------------------------------------------------------
def chain_methods(x):
    y = x * 1
    y.add_(1).mul_(2).sub_(0.5)
    return y


def relu_inplace(x):
    y = x @ x.t()
    torch.nn.functional.relu(y, inplace=True)
    return y


def inplace_then_read_view(x):
    y = x + 1
    v = y[1]
    y.mul_(3)
    return v * 1


def sibling_views(x):
    y = x.clone()
    a, b = y[0], y[:, 0]
    a.fill_(7)
    return b + 0, y


def view_of_view_write(x):
    y = x.clone()
    y.view(-1)[2:5].mul_(10)
    return y


def intermediate_returned_twice(x):
    y = x * 2
    return y, y, y.view(-1)


def outputs_alias_each_other(x):
    y = x.sin()
    a = y[0]
    y.add_(1)
    return a, y.t()


# --- in-place on inputs ---------------------------------------------------------------------------
def add_input(x, y):
    x.add_(y)


def add_returns_input(x):
    y = x.add_(1)
    return y


def mul_input_return_other(x):
    x.mul_(2)
    return x * 3


def two_inputs_mutated(x, y):
    x.add_(1)
    y.sub_(x)
    return x + y


def input_mutated_after_read(x):
    a = x * 2
    x.zero_()
    return a


# --- writes through views of inputs ---------------------------------------------------------------
def write_view(x):
    x.view(4, 3)[1] = 5.0


def write_reshape(x):
    x.reshape(-1)[3:6] = 0.0
    return x


def write_flatten(x):
    x.flatten().mul_(2)


def write_unflatten(x):
    x.unflatten(1, (2, 2))[:, 1].add_(1)
    return x.sum()


def slice_step(x):
    x[::2].mul_(-1)


def slice_step_cols(x):
    x[:, 1::2] = 3.0


def select_write(x):
    x[1] = 0.0
    return x[1]


def narrow_write(x):
    x.narrow(1, 1, 2).add_(10)


def t_write(x):
    x.t()[0].fill_(1.0)


def transpose_write(x):
    x.transpose(0, 2)[1, 2].mul_(0)


def permute_write(x):
    x.permute(2, 0, 1)[0] += 1


def movedim_write(x):
    x.movedim(0, -1)[..., 1].zero_()


def squeeze_write(x):
    x.squeeze(1).add_(2)


def unsqueeze_write(x):
    x.unsqueeze(0)[0, 1].mul_(3)


def diagonal_write(x):
    x.diagonal().fill_(9.0)


def diagonal_offset_write(x):
    x.diagonal(1).add_(1)
    x.diagonal(-1).sub_(1)


def diagonal_dims_write(x):
    x.diagonal(0, 1, 2).mul_(2)


def unbind_write(x):
    a, b, c = x.unbind(0)
    b.mul_(2)
    return a + c


def split_write(x):
    parts = x.split(2)
    parts[1].add_(100)
    return parts[0]


def chunk_write(x):
    c = x.chunk(3, dim=1)
    c[2].zero_()
    return c[0] * 1


def split_sizes_write(x):
    a, b = x.split([1, 3])
    b[0].fill_(4.0)
    return a


def as_strided_write(x):
    x.as_strided((2, 2), (4, 1), 1).fill_(-1.0)


def unfold_write(x):
    x.unfold(0, 2, 2).mul_(3)


def unfold_gap_write(x):
    x.unfold(0, 2, 3).mul_(3)


def detach_write(x):
    x.detach().add_(1)


def dtype_view_write(x):
    x.view(torch.int32).bitwise_xor_(1)


def view_as_real_write(x):
    torch.view_as_real(x)[..., 1].mul_(-1)


def view_as_complex_write(x):
    torch.view_as_complex(x).mul_(1j)


def real_write(x):
    x.real.add_(1)


def imag_write(x):
    x.imag.zero_()
    return x.real * 1


def nested_views_write(x):
    x[0][:, 1][1:].add_(1)


def view_read_after_write(x):
    v = x[1]
    x.mul_(2)
    return v + 0


def return_view_of_input(x):
    x.add_(1)
    return x[0], x.t()


def return_view_unmodified(x):
    return x[1:], x.view(-1)


VIEW_WRITE_PROGRAMS = [
    (chain_methods, lambda: (r(5),)),
    (relu_inplace, lambda: (r(3, 3),)),
    (inplace_then_read_view, lambda: (r(3, 2),)),
    (sibling_views, lambda: (r(3, 3),)),
    (view_of_view_write, lambda: (r(2, 4),)),
    (intermediate_returned_twice, lambda: (r(2, 2),)),
    (outputs_alias_each_other, lambda: (r(2, 3),)),
    (add_input, lambda: (r(3), r(3))),
    (add_returns_input, lambda: (r(3),)),
    (mul_input_return_other, lambda: (r(3),)),
    (two_inputs_mutated, lambda: (r(3), r(3))),
    (input_mutated_after_read, lambda: (r(3),)),
    (write_view, lambda: (r(12),)),
    (write_reshape, lambda: (r(3, 4),)),
    (write_flatten, lambda: (r(2, 3),)),
    (write_unflatten, lambda: (r(3, 4),)),
    (slice_step, lambda: (r(7, 2),)),
    (slice_step_cols, lambda: (r(3, 6),)),
    (select_write, lambda: (r(3, 2),)),
    (narrow_write, lambda: (r(3, 4),)),
    (t_write, lambda: (r(3, 4),)),
    (transpose_write, lambda: (r(3, 4, 5),)),
    (permute_write, lambda: (r(2, 3, 4),)),
    (movedim_write, lambda: (r(2, 3, 4),)),
    (squeeze_write, lambda: (r(3, 1, 2),)),
    (unsqueeze_write, lambda: (r(3, 2),)),
    (diagonal_write, lambda: (r(4, 4),)),
    (diagonal_offset_write, lambda: (r(4, 5),)),
    (diagonal_dims_write, lambda: (r(2, 3, 3),)),
    (unbind_write, lambda: (r(3, 4),)),
    (split_write, lambda: (r(5, 2),)),
    (chunk_write, lambda: (r(2, 6),)),
    (split_sizes_write, lambda: (r(4, 2),)),
    (as_strided_write, lambda: (r(4, 4),)),
    (unfold_write, lambda: (r(6),)),
    (unfold_gap_write, lambda: (r(8),)),
    (detach_write, lambda: (r(3),)),
    (dtype_view_write, lambda: (r(4),)),
    (view_as_real_write, lambda: (torch.randn(3, dtype=torch.complex64),)),
    (view_as_complex_write, lambda: (r(3, 2),)),
    (real_write, lambda: (torch.randn(3, dtype=torch.complex64),)),
    (imag_write, lambda: (torch.randn(3, dtype=torch.complex64),)),
    (nested_views_write, lambda: (r(2, 3, 4),)),
    (view_read_after_write, lambda: (r(2, 3),)),
    (return_view_of_input, lambda: (r(2, 3),)),
    (return_view_unmodified, lambda: (r(3, 2),)),
]
