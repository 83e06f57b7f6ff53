"""Address and key patterns (PCI, MAC, /dev/disk/by-id, SSH key) defined once for both agents.

Plain strings for pydantic's `Field(pattern=...)`, the JSON Schemas and
`re.compile`. This module imports nothing, so the host agent checks plan
values against the very rules validation applied without loading the models.
"""

PCI_RE = r"^[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]$"
MAC_RE = r"^[0-9a-f]{2}(:[0-9a-f]{2}){5}$"
BY_ID_PREFIX = "/dev/disk/by-id/"
# A by-id name is what udev writes: no slash, no "..", no shell metacharacters.
BY_ID_NAME_RE = r"^[A-Za-z0-9][A-Za-z0-9._:+@-]{0,200}$"
BY_ID_RE = "^" + BY_ID_PREFIX + BY_ID_NAME_RE.removeprefix("^")
# An OpenSSH public key line: validation checks it, the cloud-init seed checks it again.
SSH_KEY_RE = (
    r"^(ssh-(ed25519|rsa|dss)|ecdsa-sha2-nistp(256|384|521)|sk-ssh-ed25519@openssh\.com)"
    r" [A-Za-z0-9+/=]+( [^\n\r]{0,200})?$"
)
