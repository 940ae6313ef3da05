"""`drape eval`: the metrics try-on papers report (paired SSIM, LPIPS, FID, KID; unpaired FID, KID),
on a dataset's official test split, under a protocol printed beside the numbers."""
