"""Known gaps that tests name exactly, so that they fail when the gap closes or grows.

(None open at present. Issue 29 item 3's LIBRARY_SEED_GAP, the library's Dataset drawing from
a numpy generator seeded 0 whatever the program's seed, is closed: a Dataset's draws from
torch's global generator come from numpy's global generator, which every torch.manual_seed's
translation seeds too.)
"""
