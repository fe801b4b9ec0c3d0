from triton_dispatch.testing.imports import mutual_imports

#: the circles still to break (a declaration and the plan or dispatch module beside it); a new
#: circle fails this test, and so does breaking one of these without removing it from the list
KNOWN = [
    ("late_interaction_kernels.ops.maxsim.op", "late_interaction_kernels.ops.maxsim.plan"),
    ("late_interaction_kernels.ops.maxsim_from_hidden.dispatch",
     "late_interaction_kernels.ops.maxsim_from_hidden.op"),
    ("late_interaction_kernels.ops.maxsim_residual.dispatch",
     "late_interaction_kernels.ops.maxsim_residual.op"),
]  # fmt: skip


def test_no_modules_import_each_other_but_the_known_ones():
    assert mutual_imports("late_interaction_kernels") == KNOWN
