//! The one piece of X.509 kprov needs: kubeadm's CA pin, the sha256 of the CA certificate's
//! DER-encoded SubjectPublicKeyInfo (what `--discovery-token-ca-cert-hash` holds).
//! A minimal DER walk; it never panics on malformed input.

use sha2::{Digest, Sha256};

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PkiError {
    #[error("no PEM CERTIFICATE block found")]
    NoPem,
    #[error("invalid base64 in the PEM block")]
    Base64,
    #[error("malformed certificate DER: {0}")]
    Der(&'static str),
}

/// Hex sha256 of the SubjectPublicKeyInfo of the first certificate in `pem`.
pub fn ca_cert_hash(pem: &str) -> Result<String, PkiError> {
    let der = pem_certificate(pem)?;
    let spki = subject_public_key_info(&der)?;
    Ok(hex::encode(Sha256::digest(spki)))
}

fn pem_certificate(pem: &str) -> Result<Vec<u8>, PkiError> {
    let begin = "-----BEGIN CERTIFICATE-----";
    let end = "-----END CERTIFICATE-----";
    let start = pem.find(begin).ok_or(PkiError::NoPem)? + begin.len();
    let stop = pem[start..].find(end).ok_or(PkiError::NoPem)? + start;
    base64_decode(&pem[start..stop])
}

fn base64_decode(text: &str) -> Result<Vec<u8>, PkiError> {
    let mut out = Vec::with_capacity(text.len() * 3 / 4);
    let mut acc: u32 = 0;
    let mut bits = 0;
    for c in text.bytes() {
        let v = match c {
            b'A'..=b'Z' => c - b'A',
            b'a'..=b'z' => c - b'a' + 26,
            b'0'..=b'9' => c - b'0' + 52,
            b'+' => 62,
            b'/' => 63,
            b'=' => break,
            b' ' | b'\n' | b'\r' | b'\t' => continue,
            _ => return Err(PkiError::Base64),
        };
        acc = (acc << 6) | u32::from(v);
        bits += 6;
        if bits >= 8 {
            bits -= 8;
            out.push((acc >> bits) as u8);
            acc &= (1 << bits) - 1;
        }
    }
    Ok(out)
}

/// One DER element: (tag, whole element bytes, content bytes, rest after it).
type Element<'a> = (u8, &'a [u8], &'a [u8], &'a [u8]);

fn element(input: &[u8]) -> Result<Element<'_>, PkiError> {
    let (&tag, rest) = input.split_first().ok_or(PkiError::Der("truncated tag"))?;
    let (&first, rest) = rest
        .split_first()
        .ok_or(PkiError::Der("truncated length"))?;
    let (len, rest) = if first < 0x80 {
        (usize::from(first), rest)
    } else {
        let n = usize::from(first & 0x7f);
        if n == 0 || n > 4 || rest.len() < n {
            return Err(PkiError::Der("bad length"));
        }
        let len = rest[..n]
            .iter()
            .fold(0usize, |a, b| (a << 8) | usize::from(*b));
        (len, &rest[n..])
    };
    if rest.len() < len {
        return Err(PkiError::Der("element longer than its input"));
    }
    let header = input.len() - rest.len();
    Ok((tag, &input[..header + len], &rest[..len], &rest[len..]))
}

fn subject_public_key_info(der: &[u8]) -> Result<&[u8], PkiError> {
    const SEQUENCE: u8 = 0x30;
    let (tag, _, cert, _) = element(der)?;
    if tag != SEQUENCE {
        return Err(PkiError::Der("certificate is not a SEQUENCE"));
    }
    let (tag, _, tbs, _) = element(cert)?;
    if tag != SEQUENCE {
        return Err(PkiError::Der("tbsCertificate is not a SEQUENCE"));
    }
    let mut rest = tbs;
    // [0] version (optional), serialNumber, signature, issuer, validity, subject, then SPKI.
    let (tag, _, _, after) = element(rest)?;
    if tag == 0xa0 {
        rest = after;
    }
    for _ in 0..5 {
        let (_, _, _, after) = element(rest)?;
        rest = after;
    }
    let (tag, whole, _, _) = element(rest)?;
    if tag != SEQUENCE {
        return Err(PkiError::Der("subjectPublicKeyInfo is not a SEQUENCE"));
    }
    Ok(whole)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    // A self-signed CA made with `openssl req -x509 -newkey ec -pkeyopt
    // ec_paramgen_curve:prime256v1 -subj /CN=kubernetes -days 3650 -nodes`; its pin was
    // computed with `openssl x509 -pubkey -noout | openssl pkey -pubin -outform der |
    // sha256sum`, kubeadm's documented recipe.
    const CA: &str = include_str!("testdata/ca.crt");
    const CA_HASH: &str = include_str!("testdata/ca.hash");

    #[test]
    fn matches_openssl() {
        assert_eq!(ca_cert_hash(CA).unwrap(), CA_HASH.trim());
    }

    #[test]
    fn errors() {
        assert_eq!(ca_cert_hash("nothing"), Err(PkiError::NoPem));
        assert_eq!(
            ca_cert_hash("-----BEGIN CERTIFICATE-----\n!!\n-----END CERTIFICATE-----"),
            Err(PkiError::Base64)
        );
        assert!(matches!(
            ca_cert_hash("-----BEGIN CERTIFICATE-----\nMAMCAQE=\n-----END CERTIFICATE-----"),
            Err(PkiError::Der(_))
        ));
    }

    proptest! {
        #[test]
        fn never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..300)) {
            let _ = subject_public_key_info(&bytes);
        }

        #[test]
        fn never_panics_on_text(body in "[A-Za-z0-9+/=\n]{0,200}") {
            let _ = ca_cert_hash(&format!("-----BEGIN CERTIFICATE-----\n{body}\n-----END CERTIFICATE-----"));
        }
    }
}
