"""The probe language: the kernel's dynamic-event grammar and probescope's friendly form."""
