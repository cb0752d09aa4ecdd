//! TLS 1.3 configurations: no certificate authorities, keys pinned by fingerprint both ways.

use std::sync::{Arc, Mutex};

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::{verify_tls13_signature, CryptoProvider};
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::server::danger::{ClientCertVerified, ClientCertVerifier};
use rustls::{DigitallySignedStruct, DistinguishedName, SignatureScheme};

use crate::keys::{Fingerprint, Identity};
use crate::NetError;

fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

fn tls_err(e: rustls::Error) -> NetError {
    NetError::BadKey(format!("TLS setup: {e}"))
}

/// Checks the signatures that prove the peer holds its key; the key itself is judged by its
/// fingerprint elsewhere.
fn check_signature(
    p: &CryptoProvider,
    message: &[u8],
    cert: &CertificateDer<'_>,
    dss: &DigitallySignedStruct,
) -> Result<HandshakeSignatureValid, rustls::Error> {
    verify_tls13_signature(message, cert, dss, &p.signature_verification_algorithms)
}

fn no_tls12() -> rustls::Error {
    rustls::Error::General("TLS 1.2 is not offered".into())
}

/// The client's check of the server: its key must be the pinned one (or, with none pinned yet,
/// any key, which the caller then records: trust on first use).
#[derive(Debug)]
pub(crate) struct PinnedServer {
    provider: Arc<CryptoProvider>,
    expect: Option<Fingerprint>,
    pub(crate) seen: Mutex<Option<Fingerprint>>,
}

impl ServerCertVerifier for PinnedServer {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        let fp = Fingerprint::of(end_entity);
        *self.seen.lock().unwrap() = Some(fp);
        match self.expect {
            Some(e) if e != fp => Err(rustls::Error::General(format!(
                "the server's key is {fp}, not the pinned {e}"
            ))),
            _ => Ok(ServerCertVerified::assertion()),
        }
    }

    fn verify_tls12_signature(
        &self,
        _: &[u8],
        _: &CertificateDer<'_>,
        _: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        Err(no_tls12())
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        check_signature(&self.provider, message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.provider
            .signature_verification_algorithms
            .supported_schemes()
    }
}

/// The server's check of a client: any key that proves possession passes the handshake; the
/// daemon then looks its fingerprint up in `authorized_keys` and refuses over the protocol, so
/// the client learns why.
#[derive(Debug)]
struct AnyClientKey {
    provider: Arc<CryptoProvider>,
}

impl ClientCertVerifier for AnyClientKey {
    fn root_hint_subjects(&self) -> &[DistinguishedName] {
        &[]
    }

    fn client_auth_mandatory(&self) -> bool {
        true
    }

    fn verify_client_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _now: UnixTime,
    ) -> Result<ClientCertVerified, rustls::Error> {
        Ok(ClientCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        _: &[u8],
        _: &CertificateDer<'_>,
        _: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        Err(no_tls12())
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        check_signature(&self.provider, message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.provider
            .signature_verification_algorithms
            .supported_schemes()
    }
}

pub(crate) fn server_config(id: &Identity) -> Result<rustls::ServerConfig, NetError> {
    let p = provider();
    rustls::ServerConfig::builder_with_provider(p.clone())
        .with_protocol_versions(&[&rustls::version::TLS13])
        .map_err(tls_err)?
        .with_client_cert_verifier(Arc::new(AnyClientKey { provider: p }))
        .with_single_cert(vec![id.cert.clone()], id.key())
        .map_err(tls_err)
}

pub(crate) fn client_config(
    id: &Identity,
    expect: Option<Fingerprint>,
) -> Result<(rustls::ClientConfig, Arc<PinnedServer>), NetError> {
    let p = provider();
    let verifier = Arc::new(PinnedServer {
        provider: p.clone(),
        expect,
        seen: Mutex::new(None),
    });
    let cfg = rustls::ClientConfig::builder_with_provider(p)
        .with_protocol_versions(&[&rustls::version::TLS13])
        .map_err(tls_err)?
        .dangerous()
        .with_custom_certificate_verifier(verifier.clone())
        .with_client_auth_cert(vec![id.cert.clone()], id.key())
        .map_err(tls_err)?;
    Ok((cfg, verifier))
}
