"""The ground truth: slow, readable NumPy float64 (Child et al., 2019, sections 4-5).

Bottom to top, each module imports only the ones above it in this list:

* ``extensions`` -- the patterns added beyond the paper's and the two neighbours, one
                   module each (NumPy only), found by their names;
* ``params``    -- pattern names, the parameters each takes, and every input check
                   (one ``check_params`` for all paths; integers bounded by 2**31 - 1);
* ``heads``     -- head roles: which part(s) each head of a layer reads (sec. 5.1,
                   eq. 5-8) and the fixed summary sub-block of its rank (sec. 4.3);
* ``patterns``  -- the masks (sec. 4.3 and the two neighbours) and ``head_masks``,
                   the contract every fast path reproduces;
* ``counts``    -- keys read per query, from closed forms (sec. 4.2);
* ``attention`` -- masked attention and its gradient (sec. 4, eq. 2-4);
* ``model``     -- the network's forward pass (sec. 5.2-5.6).

Nothing here imports torch or triton.
"""
