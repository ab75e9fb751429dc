"""Chapter 11: SSD's fused forward.

    forward     ``ssd_fused_forward``: both designs behind one function
    states      the chunk states and their passing, one kernel
    outputs     the outputs from the passed states, one kernel
    one_launch  the whole forward in one launch (programs wait on their left neighbour)
"""
